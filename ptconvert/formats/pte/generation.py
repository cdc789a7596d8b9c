"""ExecuTorch with a static cache (``--to pte --task text-generation-with-past``): the
decoder-only LM's static-cache program (``static_cache.py``'s wrapper, the cache in the
program's buffers as for AOTI) lowered by ExecuTorch (``--pte-backend``: XNNPACK or the
portable kernels), as optimum-executorch exports LLMs.

The cache tensors are mutable buffers of the method: ExecuTorch keeps them in its planned
memory between calls of one loaded method, so the program steps like the pt2 (``input_ids``
batch × 1 to N new tokens, ``cache_position``; position 0 starts a new sequence). Their initial
zeros are written into the file (``InitializedMutableBufferPass``): left uninitialized, as
ExecuTorch would, a key that is not a number at a masked position still turns the attention's
sums into NaN. What a runner needs to know is in constant methods, under the names ExecuTorch's
LLM runners read: ``get_max_seq_len`` (the cache's positions), ``get_max_batch_size`` (its
rows), ``use_kv_cache``, ``get_vocab_size``, ``get_eos_ids``; ``read_meta`` reads them back from
the flatbuffer (nothing run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ptconvert.deps import require
from ptconvert.errors import named_error
from ptconvert.formats.pte import PteFormat
from ptconvert.formats.pte.edges.export import lower
from ptconvert.formats.pte.options import PteOptions
from ptconvert.generation.static_cache import StaticCacheProgram
from ptconvert.generation.targets import Target
from ptconvert.quiet import quiet_torch

# ExecuTorch's LLM runners (TextLLMRunner) feed one row: the program is written for it, and
# checked there, unless --batch-sizes asks for more rows
BATCHES = (1,)

# the wrapper's buffers (``static_cache._own_buffers``) that the file gives their zeros
_CACHE_BUFFERS = ["key_cache", "value_cache", "cumulative_length"]


def export_program(
    model: Any, src: Path, tmp: Path, out: Path, opts: Any, notes: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The decoder-only LM into a ``.pte`` at ``tmp``: exported with its static cache in
    buffers, lowered, the constant methods added; the report's cache and interface (``src``
    and ``out``: an AOTI package's, ``targets.Target``)."""
    from ptconvert import progress
    from ptconvert.generation.static_cache import export_static

    with quiet_torch():  # importing it loads torchao, which prints what it cannot load
        require("executorch.exir")
    ep, batch, length = export_static(model, opts, own_buffers=True, batches=BATCHES)
    eos = model.generation_config.eos_token_id
    methods: dict[str, Any] = {
        "get_max_seq_len": length,
        "get_max_batch_size": batch,
        "use_kv_cache": True,
        "get_vocab_size": int(model.config.get_text_config().vocab_size),
    }
    if eos is not None:
        methods["get_eos_ids"] = list(eos) if isinstance(eos, (list, tuple)) else [int(eos)]
    backend = opts.of(PteOptions).pte_backend
    with progress.step(f"lowering with ExecuTorch ({backend})"):
        program = lower(
            ep,
            backend,
            constant_methods=methods,
            mutable_buffers=_CACHE_BUFFERS,
            what="the static-cache program",
        )
    try:
        with open(tmp, "wb") as fh:
            program.write_to_file(fh)
    except OSError as exc:  # the filesystem (no space, read-only …): said as such, exit 9
        raise named_error(exc, tmp) or exc from None
    from ptconvert.formats.pte.flatbuffer import read_program

    initial = read_program(tmp).segment_bytes.get("mutable data", 0)
    notes.append(
        f"static cache of {batch} row(s) × {length} positions in the method's mutable buffers "
        "(ExecuTorch keeps them between calls of one loaded method; their initial zeros are "
        f"in the file: {initial / 2**20:.2f} MiB); lowered with {backend}; "
        "constant methods get_max_seq_len, get_max_batch_size, use_kv_cache, get_vocab_size, "
        "get_eos_ids; a smaller batch runs padded with copies of its last row "
        "(ptconvert.generate does it)"
        + ("" if batch == 1 else f"; ExecuTorch's LLM runners feed 1 row, not {batch}")
    )
    cache = {"kind": "static", "batch_size": batch, "length": length}
    interface = {
        "call": 'prog = Runtime.get().load_program(p).load_method("forward"); '
        "prog.execute([ids[batch, n], arange(pos, pos + n)]) → [logits]",
        "inputs": ["input_ids", "cache_position"],
        "outputs": ["logits"],
    }
    return cache, interface


def read_meta(path: Path) -> dict[str, Any] | None:
    """The static cache a .pte says it has (its constant methods), as ``generation.json``
    says it of a pt2; None when it has none."""
    from ptconvert.formats.pte import constant_methods

    methods = constant_methods(path)
    if not methods.get("use_kv_cache") or "get_max_seq_len" not in methods:
        return None
    eos = methods.get("get_eos_ids")
    return {
        "task": "text-generation-with-past",  # the one task written as a .pte
        "cache": "static",
        "batch_size": int(methods.get("get_max_batch_size", 1)),
        "cache_length": int(methods["get_max_seq_len"]),
        "eos_token_id": eos,
    }


def open_program(path: Path, trust: bool) -> PteStaticCache | None:
    """The stepper of a .pte with a static cache; None for another program (``trust``: an
    AOTI package's, ``targets.Target``)."""
    meta = read_meta(path)
    return None if meta is None else PteStaticCache(path, meta)


class PteStaticCache(StaticCacheProgram):
    """A .pte with a static cache, run by ExecuTorch's runtime in its own process
    (``formats/isolated.py``); the process holds the loaded method, so the cache buffers it
    mutates stay between the calls. Stepped as ``StaticCacheProgram`` is."""

    what = "program"

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        from ptconvert.deps import require_installed
        from ptconvert.formats.isolated import IsolatedRuntime
        from ptconvert.formats.pte.runtime import load as load_runtime
        from ptconvert.scan.guard import guard

        guard(path)  # every file loaded goes through the scanner (a .pte: no pickle, clean)
        require_installed("executorch")  # said here, not in the child
        self.runtime = IsolatedRuntime("pte", str(path), load=load_runtime)
        self._sized(path, meta)

    def _run(self, input_ids: Any, cache_position: Any) -> Any:
        (logits,) = self.runtime(input_ids=input_ids.contiguous(), cache_position=cache_position)
        return logits

    def close(self) -> None:
        self.runtime.close()


RUNNER = "ExecuTorch's TextLLMRunner"


def client_check(model: Any, program: Path, src: Path, opts: Any) -> str:
    """The written program generating in ``TextLLMRunner`` as an app runs it
    (``llm_runner.py``, its own process), greedy from a prompt text tokenized by the source's
    ``tokenizer.json``, its pieces against transformers' tokens (``text_check``); the report's
    note. It runs where the directory has a tokenizer.json, the wheel has the runner and the
    program one row (the runner feeds one); otherwise the note says why not."""
    from ptconvert import progress
    from ptconvert.formats.pte.llm_runner import generate_pieces, runner_installed
    from ptconvert.generation import text_check
    from ptconvert.generation.check import NEW_TOKENS

    tokenizer_file = src / text_check.TOKENIZER_FILE
    if not tokenizer_file.is_file():
        return f"not run in {RUNNER}: the directory has no {text_check.TOKENIZER_FILE}"
    if not runner_installed():
        return f"not run in {RUNNER}: the executorch wheel has no executorch.extension.llm.runner"
    meta = read_meta(program)
    if meta is None or meta["batch_size"] != 1:
        rows = meta["batch_size"] if meta else "no"
        return f"not run in {RUNNER}: the program's cache has {rows} rows, the runner feeds 1"
    try:
        tokenizer = text_check.load_tokenizer(tokenizer_file)
    except Exception as exc:  # any reason tokenizers gives is the note's
        return f"not run in {RUNNER}: tokenizers cannot read its tokenizer.json ({exc})"
    vocab = int(model.config.get_text_config().vocab_size)
    prompt, ids = text_check.prompt_text(tokenizer, vocab, opts.seed)
    new_tokens = min(NEW_TOKENS, meta["cache_length"] - len(ids))
    if not ids or new_tokens < 1:
        return f"not run in {RUNNER}: no prompt its tokenizer.json and cache fit"
    eos = meta["eos_token_id"]  # the constant method's values: one id reads back as an int
    eos = [eos] if isinstance(eos, int) else list(eos or ())
    want = text_check.expected_tokens(model, ids, new_tokens, eos)
    with progress.step(f"generating in {RUNNER}"):
        pieces = generate_pieces(program, tokenizer_file, prompt, new_tokens)
    text_check.compare_pieces(
        RUNNER, pieces, want, tokenizer, prompt, may_stop_early=not eos, path=program
    )
    return (
        f"ran in {RUNNER} (a process of its own): its {len(pieces)} greedy tokens for the "
        f"prompt {prompt!r} match transformers'"
    )


def describe(info: Any) -> None:
    """The task and cache from the constant methods an ExecuTorch LLM runner reads."""
    methods = info.metadata.get("constant_methods", {})
    if methods.get("use_kv_cache") and "get_max_seq_len" in methods:
        info.metadata["task"] = "text-generation-with-past"
        info.metadata["cache"] = (
            f"static, batch {methods.get('get_max_batch_size')}, "
            f"{methods['get_max_seq_len']} positions"
        )


# the static-cache program lowered by ExecuTorch
TARGETS = [
    Target(
        PteFormat.name,
        "decoder",
        export_program,
        read_meta,
        open_program,
        requires="executorch",
        describe=describe,
        batches=BATCHES,
        client_check=client_check,
    )
]
