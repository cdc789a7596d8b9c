"""The options of every command, each declared once as a dataclass field: its name is the API's
keyword (``dynamic_batch``), its metadata the CLI's flag (``--dynamic-batch``: its help, type,
choices, aliases; ``flag()``), from which cli_flags.py makes the click options.

``Options`` holds what every command shares (a conversion, and what says which model a file
holds); ``VerifyKeywords`` and ``BenchKeywords`` the keywords ``verify`` and ``bench`` take
beside them."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from ptconvert.errors import UsageError

# --dynamic NAME:AXIS[:MIN:MAX]
DYNAMIC_SPEC = re.compile(r"^(?P<name>\w+):(?P<axis>\d+)(?::(?P<min>\d+):(?P<max>\d+))?$")

Method = Literal["auto", "script", "trace"]
ExportMode = Literal["auto", "strict", "non-strict"]
Device = Literal["cpu", "cuda"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "none"]
Dtype = Literal["float32", "float16", "bfloat16"]
# --quantize: one vocabulary across targets, each target declaring the schemes it writes
# (``Format.quantize_schemes``); int8: int8 weights, activations quantized per call (dynamic) or
# kept floating (weight-only), as the target's own quantizer does it
Quantize = Literal["int8", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"]

# --task as optimum names tasks. Those that export for generation with a cache (ptconvert/
# generation/): a decoder-only LM, a seq2seq model, a speech seq2seq model
GENERATION_TASKS: dict[str, str] = {
    "text-generation-with-past": "decoder",
    "text2text-generation-with-past": "seq2seq",
    "automatic-speech-recognition-with-past": "speech-seq2seq",
}
# the others: the graph without a cache, the transformers Auto class loading the directory
TASK_CLASSES: dict[str, str] = {
    "feature-extraction": "AutoModel",
    "text-generation": "AutoModelForCausalLM",
    "text2text-generation": "AutoModelForSeq2SeqLM",
    "automatic-speech-recognition": "AutoModelForSpeechSeq2Seq",
    "fill-mask": "AutoModelForMaskedLM",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "multiple-choice": "AutoModelForMultipleChoice",
    "image-classification": "AutoModelForImageClassification",
}

# how a flag's text becomes the field's value (cli_flags.py), beyond taking it as it is
Parse = Literal["model_args", "key_values", "literal_values", "batch_sizes", "path"]
_FIELD_DEFAULT: Any = object()
T = TypeVar("T")


def flag(
    *decls: str,
    help: str | None = None,
    group: str | None = None,
    type: Callable[[str], Any] | None = None,
    choices: tuple[str, ...] | None = None,
    multiple: bool = False,
    metavar: str | None = None,
    hidden: bool = False,
    parse: Parse | None = None,
    default: Any = _FIELD_DEFAULT,
) -> dict[str, Any]:
    """The metadata of a field that is a CLI flag: ``decls`` its names (``"-o", "--output"``),
    ``group`` the flags shown together (Options': ``model``, what says which model and what it
    is fed; the others, what a conversion is asked for). A bool field is a flag that turns its
    default over (``--no-verify`` sets ``verify`` False); ``type`` int, float or Path (a path),
    else text; ``multiple`` repeats it; ``parse`` reads the text into the field's type;
    ``default`` the flag's own where it differs from the field's (the API's ``None``, "the
    options' value", is the flag's ``cpu``)."""
    return {
        "flag": {
            "decls": decls,
            "help": help,
            "group": group,
            "type": type,
            "choices": choices,
            "multiple": multiple,
            "metavar": metavar,
            "hidden": hidden,
            "parse": parse,
            "default": default,
        }
    }


def flag_of(f: Field[Any]) -> dict[str, Any]:
    """What ``flag()`` declared for the field ``f``, its default filled in (None for a field
    made by a factory: a flag given no value)."""
    spec = dict(f.metadata["flag"])
    if spec["default"] is _FIELD_DEFAULT:
        spec["default"] = None if f.default is MISSING else f.default
    return spec


def check_choices(options: Any) -> None:
    """Each field of the dataclass ``options`` whose flag has choices holds one of them (an API
    caller has no CLI to check them); a UsageError naming the field otherwise."""
    for f in fields(options):
        choices = f.metadata.get("flag", {}).get("choices")
        value = getattr(options, f.name)
        if choices and value is not None and value not in choices:
            raise UsageError(f"{f.name}={value!r} is not one of {', '.join(choices)}")


@dataclass
class Options:
    # --- which model a file holds and what it is fed (group "model") ---
    model: str | None = field(
        default=None,
        metadata=flag(
            "--model", group="model", help="Model spec: pkg.module:factory or file.py:factory."
        ),
    )
    model_args: dict[str, Any] = field(
        default_factory=dict,
        metadata=flag(
            "--model-arg",
            group="model",
            multiple=True,
            parse="model_args",
            help="k=v argument for the factory (repeatable).",
        ),
    )
    inputs: list[str] = field(
        default_factory=list,
        metadata=flag(
            "--input",
            group="model",
            multiple=True,
            help="Example input: NAME:SHAPE:DTYPE[:LOW:HIGH | :=VALUE] or NAME::DTYPE=VALUE.",
        ),
    )
    example_inputs: Path | None = field(
        default=None,
        metadata=flag(
            "--example-inputs",
            group="model",
            type=Path,
            parse="path",
            help="Example inputs (.safetensors/.pt).",
        ),
    )
    # example inputs are drawn from this seed (and the batch size)
    seed: int = field(
        default=0,
        metadata=flag("--seed", group="model", type=int, help="Seed of generated example inputs."),
    )
    # the classes a pickle names (rebuilt, never run), AOTI native code
    trust: bool = field(
        default=False,
        metadata=flag(
            "--trust",
            group="model",
            help="Rebuild the classes a pickle names by the default mechanism (none of their "
            "code runs on the file's data); load AOTI native code.",
        ),
    )
    allow: list[str] = field(  # trusted classes, named one by one
        default_factory=list,
        metadata=flag(
            "--allow",
            group="model",
            multiple=True,
            metavar="MOD.NAME",
            help="Rebuild this one class a pickle names (repeatable), by its own code when it "
            "has some (__new__, __setstate__ …: a warning says so).",
        ),
    )
    # a model folder's own .py files (config.json's auto_map), as transformers names the grant
    trust_remote_code: bool = field(
        default=False,
        metadata=flag(
            "--trust-remote-code",
            group="model",
            help="Run a model folder's own code (the .py files its auto_map names), as "
            "transformers' trust_remote_code.",
        ),
    )
    # seconds a trusted load may take (in a process of its own) before it is stopped
    load_timeout: float = field(
        default=300.0,
        metadata=flag(
            "--load-timeout",
            group="model",
            type=float,
            metavar="SECONDS",
            help="Stop a load of a user file that takes longer (default 300 s).",
        ),
    )
    non_strict: bool = field(  # leave out checkpoint keys the model does not have (reported)
        default=False,
        metadata=flag(
            "--non-strict",
            group="model",
            help="Leave out checkpoint keys the model does not have (reported); missing keys "
            "stay an error.",
        ),
    )
    # a Hugging Face Hub id as the source (hub.py): which snapshot, in which cache
    revision: str | None = field(
        default=None,
        metadata=flag(
            "--revision",
            group="model",
            help="A Hugging Face Hub id as the source (owner/name): its branch, tag or commit "
            "(default main).",
        ),
    )
    cache_dir: Path | None = field(
        default=None,
        metadata=flag(
            "--cache-dir",
            group="model",
            type=Path,
            parse="path",
            help="A Hub id: the huggingface_hub cache that holds it (default HF_HUB_CACHE, else "
            "~/.cache/huggingface/hub).",
        ),
    )
    # --- what a conversion is asked for (no group) ---
    force: bool = field(default=False, metadata=flag("--force", help="Replace an existing output."))
    verify: bool = field(
        default=True, metadata=flag("--no-verify", help="Skip the parity check after converting.")
    )
    # programs: reuse a verified artifact of the same inputs (convert/cache.py)
    cache: bool = field(
        default=True,
        metadata=flag(
            "--no-cache",
            help="Programs: neither reuse nor fill the cache of verified artifacts "
            "(PTCONVERT_CACHE).",
        ),
    )
    key: str | None = field(
        default=None,
        metadata=flag("--key", help="Take the weights from this entry of a checkpoint dict."),
    )
    keep_prefix: bool = field(
        default=False, metadata=flag("--keep-prefix", help="Keep a prefix shared by all keys.")
    )
    # safetensors targets: shards of at most this (e.g. "5GB")
    max_shard_size: str | None = field(
        default=None,
        metadata=flag("--max-shard-size", help="Write shards of at most this size (e.g. 5GB)."),
    )
    metadata: dict[str, str] = field(  # safetensors header metadata
        default_factory=dict,
        metadata=flag(
            "--metadata",
            multiple=True,
            parse="key_values",
            help="k=v safetensors metadata (repeatable).",
        ),
    )
    dynamic_batch: bool = field(
        default=False,
        metadata=flag("--dynamic-batch", help="Make dimension 0 of batched inputs dynamic."),
    )
    # with dynamic_batch, a Hugging Face text model's sequence (dim 1 of input_ids,
    # attention_mask, …) is dynamic too, as optimum exports them; this keeps it at the example's
    static_sequence: bool = field(
        default=False,
        metadata=flag(
            "--static-sequence",
            help="With --dynamic-batch: keep a Hugging Face model's other axes (text and decoder "
            "sequence, waveform samples, image height/width) at the example's sizes (by default "
            "they are dynamic, up to the config's limits).",
        ),
    )
    dynamic: list[str] = field(
        default_factory=list,
        metadata=flag("--dynamic", multiple=True, help="NAME:AXIS[:MIN:MAX] dynamic dimension."),
    )
    # torchscript: script, trace, or script falling back to trace
    method: Method = field(
        default="auto",
        metadata=flag(
            "--method",
            choices=get_args(Method),
            help="TorchScript: script, trace, or auto (script, falling back to trace).",
        ),
    )
    # export: non-strict, then strict (auto); or one of them
    strict: ExportMode = field(
        default="auto",
        metadata=flag(
            "--export-mode",
            choices=get_args(ExportMode),
            help="torch.export: auto tries non-strict, then strict.",
        ),
    )
    # a transformers class (AutoModel, LlamaForCausalLM) or an optimum task name (above)
    task: str | None = field(
        default=None,
        metadata=flag(
            "--task",
            help="A Hugging Face directory: the transformers class to load (e.g. AutoModel), or "
            "an optimum task: text-generation-with-past exports a causal LM with its KV cache "
            "(pt2: a static cache; onnx: past_key_values inputs), checked by generating; "
            "text-generation, feature-extraction, … (the graph without a cache).",
        ),
    )
    # generation tasks, pt2: the static cache's length (None: the config's positions, at most 1024)
    cache_length: int | None = field(
        default=None,
        metadata=flag(
            "--cache-length",
            type=int,
            help="--task …-with-past --to pt2: the static cache's positions (default: the "
            "config's, at most 1024).",
        ),
    )
    # aoti targets are compiled for it; --bench and checks run on it
    device: Device = field(
        default="cpu",
        metadata=flag(
            "--device",
            choices=get_args(Device),
            help="Where the result runs: --to aoti compiles for it, --bench times there, and "
            "AOTI and ONNX results are checked there (eager runs on the CPU).",
        ),
    )
    # pt2/aoti/onnx: keep stack traces and source paths (of this machine) in the file
    keep_debug_info: bool = field(
        default=False,
        metadata=flag(
            "--keep-debug-info",
            help="pt2, aoti, onnx: keep each node's stack trace (source paths of this machine).",
        ),
    )
    # convert a program although the estimate exceeds free memory
    force_memory: bool = field(
        default=False,
        metadata=flag(
            "--force-memory",
            help="Convert a program although the memory estimate exceeds what is free.",
        ),
    )
    # the floating precision of what is written (None: the source's own)
    dtype: Dtype | None = field(
        default=None,
        metadata=flag(
            "--dtype",
            choices=get_args(Dtype),
            help="Write the floating weights in this precision (weights: cast, checked bitwise "
            "against the source cast the same way; programs: exported at it, checked against "
            "eager at it and against float32 eager by accuracy).",
        ),
    )
    # the quantization scheme of a program's weights (None: none)
    quantize: Quantize | None = field(
        default=None,
        metadata=flag(
            "--quantize",
            choices=get_args(Quantize),
            help="Quantize the weights (int8: onnx by onnxruntime's dynamic quantization, pt2 by "
            "torchao's int8 weight-only, judged by accuracy against float32 eager; q8_0, q4_0, "
            "q4_1, q5_0, q5_1: llama.cpp's 8-, 4- and 5-bit blocks, --to gguf).",
        ),
    )
    # --dtype's and --quantize's accuracy thresholds against float32 eager (None:
    # verify/accuracy.py's by dtype or scheme)
    min_cosine: float | None = field(
        default=None,
        metadata=flag(
            "--min-cosine",
            type=float,
            help="--dtype or --quantize on a program: the least cosine similarity of each output "
            "to float32 eager's (default 0.999 for float16, 0.99 for bfloat16, 0.98 for int8).",
        ),
    )
    max_error: float | None = field(
        default=None,
        metadata=flag(
            "--max-error",
            type=float,
            help="--dtype or --quantize on a program: the largest error of each output, as a "
            "fraction of float32 eager's largest value (default 0.02 for float16, 0.05 for "
            "bfloat16, 0.15 for int8).",
        ),
    )
    skip_unsupported: bool = field(
        default=False,
        metadata=flag("--skip-unsupported", help="Leave out quantized/sparse/nested tensors."),
    )
    # the batch sizes a dynamic-batch program is compared at (None: 1, 2, 3 and more when cheap)
    batch_sizes: list[int] | None = field(
        default=None,
        metadata=flag(
            "--batch-sizes",
            parse="batch_sizes",
            help="Batch sizes to compare a dynamic-batch program with eager at (default 1, 2, "
            "3, and 5, 7 when the model is fast), and with --bench to time (e.g. 1,8,32).",
        ),
    )

    # a target's own options (``Format.options_class``, e.g. ``opset`` of the ONNX target), by
    # field name: ``of(cls)`` reads them; the API and the CLI fill them from the same keywords
    target_options: dict[str, Any] = field(default_factory=dict)

    def of(self, cls: type[T]) -> T:
        """The options of one target, ``cls`` (a dataclass of ``flag()`` fields declared by its
        package): the values given for its fields, its defaults for the rest."""
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in self.target_options.items() if k in names})

    @property
    def trusts_code(self) -> bool:
        """Whether the user trusts some code to load (``--trust`` or ``--allow``)."""
        return self.trust or bool(self.allow)

    def validate(self) -> Options:
        """Each value of the type and range its option takes (an API caller has no CLI to
        check them); a UsageError naming the option otherwise. Returns the options."""
        check_choices(self)
        for name in ("inputs", "dynamic", "allow"):
            value = getattr(self, name)
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise UsageError(f"{name} is a list of strings, got {value!r}")
        for name in ("model_args", "metadata", "target_options"):
            if not isinstance(getattr(self, name), dict):
                raise UsageError(f"{name} is a dict, got {getattr(self, name)!r}")
        bad = [s for s in self.dynamic if not DYNAMIC_SPEC.match(s)]
        if bad:
            raise UsageError(f"--dynamic {bad[0]!r} is not NAME:AXIS[:MIN:MAX]")
        if self.max_shard_size is not None and not isinstance(self.max_shard_size, str):
            raise UsageError(f"max_shard_size is a size such as '5GB', got {self.max_shard_size!r}")
        timeout = self.load_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise UsageError(f"load_timeout is a number of seconds above 0, got {timeout!r}")
        sizes = self.batch_sizes
        if sizes is not None and (
            not isinstance(sizes, list)
            or not sizes
            or not all(isinstance(b, int) and b >= 1 for b in sizes)
        ):
            raise UsageError(f"batch_sizes is a list of batch sizes of 1 or more, got {sizes!r}")
        length = self.cache_length
        if length is not None and (not isinstance(length, int) or length < 2):
            raise UsageError(f"cache_length is an integer of 2 or more, got {length!r}")
        if self.revision is not None and not isinstance(self.revision, str):
            raise UsageError(f"revision is a branch, tag or commit, got {self.revision!r}")
        if not isinstance(self.seed, int):
            raise UsageError(f"seed is an integer, got {self.seed!r}")
        return self


@dataclass
class VerifyKeywords:
    """The keywords ``verify`` takes beside the Options fields (the ``verify`` command's own
    flags): the command passes them to ``api.verify``, which passes them on to
    ``verify/check.verify`` by name."""

    batch_sizes: list[int] | None = field(
        default=None,
        metadata=flag(
            "--batch-sizes",
            parse="batch_sizes",
            help="Comma-separated batch sizes (default: 1,2,3,5,7 if dynamic).",
        ),
    )
    atol: float | None = field(
        default=None,
        metadata=flag("--atol", type=float, help="Absolute tolerance (default: by dtype)."),
    )
    rtol: float | None = field(
        default=None,
        metadata=flag("--rtol", type=float, help="Relative tolerance (default: by dtype)."),
    )
    warn_only: bool = field(
        default=False,
        metadata=flag("--warn-only", help="Report a mismatch without failing."),
    )
    # the candidate's device (None: the options' device)
    device: Device | None = field(
        default=None,
        metadata=flag(
            "--device",
            choices=get_args(Device),
            default="cpu",
            help="Run the candidate here (the reference stays on the CPU).",
        ),
    )
    input_map: dict[str, str] | None = field(
        default=None,
        metadata=flag(
            "--input-map",
            multiple=True,
            parse="key_values",
            help="REF=CAND: feed the reference's input REF to the candidate as CAND (repeatable).",
        ),
    )


@dataclass
class BenchKeywords:
    """The keywords ``bench`` takes beside the Options fields (the ``bench`` command's own
    flags), declared here only: the command passes them to ``api.bench``, which hands them on
    as one ``BenchKeywords`` to ``verify/bench.bench_artifact`` (``generation/bench.
    bench_generation`` for a generation export)."""

    reference: str | Path | None = field(
        default=None,
        metadata=flag(
            "--reference",
            group="source",
            type=Path,
            help="The eager source (weights + --model, HF dir).",
        ),
    )
    batch_sizes: list[int] | None = field(
        default=None,
        metadata=flag(
            "--batch-sizes",
            parse="batch_sizes",
            help="Comma-separated batch sizes to time (e.g. 1,8,32).",
        ),
    )
    compile_mode: CompileMode = field(
        default="default", metadata=flag("--compile-mode", choices=get_args(CompileMode))
    )
    repeats: int = field(
        default=30, metadata=flag("--repeats", type=int, help="Timed rounds (interleaved).")
    )
    warmup: int = field(
        default=5, metadata=flag("--warmup", type=int, help="Warm-up calls before timing.")
    )
    threads: int | None = field(
        default=None,
        metadata=flag("--threads", type=int, help="torch threads for every contender."),
    )
    # where every contender runs (None: the options' device)
    device: Device | None = field(
        default=None,
        metadata=flag("--device", choices=get_args(Device), default="cpu", help="Where to run."),
    )
    # a generation export only (generation/bench.py)
    new_tokens: int | None = field(
        default=None,
        metadata=flag(
            "--new-tokens",
            type=int,
            help="A generation export: greedy tokens generated per call (default 32).",
        ),
    )
    prompt_length: int | None = field(
        default=None,
        metadata=flag(
            "--prompt-length", type=int, help="A generation export: prompt tokens (default 16)."
        ),
    )


def split_keywords(
    cls: type[VerifyKeywords | BenchKeywords], keywords: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``keywords`` parted into ``cls``'s (each field, its default where not given) and the
    rest (the Options fields to override)."""
    own = {f.name: keywords.get(f.name, f.default) for f in fields(cls)}
    return own, {k: v for k, v in keywords.items() if k not in own}
