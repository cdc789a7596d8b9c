"""The options of every command, as one dataclass: the CLI's flags by name (``--dynamic-batch``
is ``dynamic_batch``), and the keywords of the API's functions."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from ptconvert.errors import UsageError

# --dynamic NAME:AXIS[:MIN:MAX]
DYNAMIC_SPEC = re.compile(r"^(?P<name>\w+):(?P<axis>\d+)(?::(?P<min>\d+):(?P<max>\d+))?$")

Method = Literal["auto", "script", "trace"]
ExportMode = Literal["auto", "strict", "non-strict"]
Device = Literal["cpu", "cuda"]

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


@dataclass
class Options:
    model: str | None = None
    model_args: dict[str, Any] = field(default_factory=dict)
    # a transformers class (AutoModel, LlamaForCausalLM) or an optimum task name (above)
    task: str | None = None
    # generation tasks, pt2: the static cache's length (None: the config's positions, at most 1024)
    cache_length: int | None = None
    inputs: list[str] = field(default_factory=list)
    example_inputs: Path | None = None
    dynamic_batch: bool = False
    # with dynamic_batch, a Hugging Face text model's sequence (dim 1 of input_ids,
    # attention_mask, …) is dynamic too, as optimum exports them; this keeps it at the example's
    static_sequence: bool = False
    dynamic: list[str] = field(default_factory=list)
    method: Method = "auto"  # torchscript: script, trace, or script falling back to trace
    strict: ExportMode = "auto"  # export: non-strict, then strict (auto); or one of them
    trust: bool = False  # the classes a pickle names, AOTI native code, a directory's code
    allow: list[str] = field(default_factory=list)  # trusted classes, named one by one
    key: str | None = None
    non_strict: bool = False  # leave out checkpoint keys the model does not have (reported)
    keep_prefix: bool = False
    skip_unsupported: bool = False
    verify: bool = True
    force: bool = False
    seed: int = 0  # example inputs are drawn from this seed (and the batch size)
    max_shard_size: str | None = None  # safetensors targets: shards of at most this (e.g. "5GB")
    metadata: dict[str, str] = field(default_factory=dict)  # safetensors header metadata
    device: Device = "cpu"  # aoti targets are compiled for it; --bench and checks run on it
    aoti_options: dict[str, Any] = field(default_factory=dict)  # Inductor configs (k=v)
    opset: int | None = None  # onnx targets: the ai.onnx opset (None: the exporter's default)
    external_data: bool = False  # onnx targets: weights in NAME.onnx.data (always over 2 GB)
    onnx_optimize: bool = False  # onnx targets: onnxscript's graph optimizer on the result
    # pt2/aoti/onnx: keep stack traces and source paths (of this machine) in the file
    keep_debug_info: bool = False
    force_memory: bool = False  # convert a program although the estimate exceeds free memory
    cache: bool = True  # programs: reuse a verified artifact of the same inputs (convert/cache.py)
    # the batch sizes a dynamic-batch program is compared at (None: 1, 2, 3 and more when cheap)
    batch_sizes: list[int] | None = None

    @property
    def trusts_code(self) -> bool:
        """Whether the user trusts some code to load (``--trust`` or ``--allow``)."""
        return self.trust or bool(self.allow)

    def validate(self) -> Options:
        """Each value of the type and range its option takes (an API caller has no CLI to
        check them); a UsageError naming the option otherwise. Returns the options."""
        choices = {"method": Method, "strict": ExportMode, "device": Device}
        for name, kind in choices.items():
            if getattr(self, name) not in get_args(kind):
                raise UsageError(
                    f"{name}={getattr(self, name)!r} is not one of {', '.join(get_args(kind))}"
                )
        for name in ("inputs", "dynamic", "allow"):
            value = getattr(self, name)
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise UsageError(f"{name} is a list of strings, got {value!r}")
        for name in ("model_args", "metadata", "aoti_options"):
            if not isinstance(getattr(self, name), dict):
                raise UsageError(f"{name} is a dict, got {getattr(self, name)!r}")
        bad = [s for s in self.dynamic if not DYNAMIC_SPEC.match(s)]
        if bad:
            raise UsageError(f"--dynamic {bad[0]!r} is not NAME:AXIS[:MIN:MAX]")
        if self.max_shard_size is not None and not isinstance(self.max_shard_size, str):
            raise UsageError(f"max_shard_size is a size such as '5GB', got {self.max_shard_size!r}")
        if self.opset is not None and (not isinstance(self.opset, int) or self.opset < 1):
            raise UsageError(f"opset is a positive integer, got {self.opset!r}")
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
        if not isinstance(self.seed, int):
            raise UsageError(f"seed is an integer, got {self.seed!r}")
        return self
