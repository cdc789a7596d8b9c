"""pt2 with a static cache: transformers' exportable wrapper (``TorchExportableModuleForDecoderOnly
LM``, what optimum-executorch uses) exported with torch.export. The program takes ``input_ids``
(batch × a dynamic number of new tokens: the whole prompt, then one token a step) and
``cache_position`` (their places in the cache) and returns the logits; the cache lives in the
program as buffers it mutates, of a fixed batch and length (said in the report and in the
archive's ``generation.json``, which the runner reads)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ptconvert import _compat
from ptconvert.errors import UnsupportedConversionError, UsageError
from ptconvert.options import ExportMode

META_NAME = "generation.json"  # the archive's extra file: task, batch, cache length
DEFAULT_CACHE_LENGTH = 1024
# the batches a generation export is checked at (``check.py``): a static cache holds the largest
# of them unless ``--batch-sizes`` asks for others
BATCHES = (1, 2)


def cache_batch(asked: list[int] | None, default: tuple[int, ...] = BATCHES) -> int:
    """The static cache's rows: the largest batch asked (``--batch-sizes``), else of the
    target's default batch sizes (``Target.batches``)."""
    return max(asked or default)


def cache_length(model: Any, asked: int | None) -> int:
    """The static cache's length: the one asked for, else the model's positions (at most
    ``DEFAULT_CACHE_LENGTH``); never more positions than the model has."""
    config = (
        model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    )
    # the decoder's positions: Whisper's max_target_positions (its encoder's are apart)
    positions = (
        getattr(config, "max_target_positions", None)
        or getattr(config, "max_position_embeddings", None)
        or getattr(config, "n_positions", None)
    )
    length = asked or min(positions or DEFAULT_CACHE_LENGTH, DEFAULT_CACHE_LENGTH)
    if positions and length > positions:
        raise UnsupportedConversionError(
            f"a cache of {length} positions is longer than the model's {positions}"
        )
    return int(length)


def export_static(
    model: Any, opts: Any, *, own_buffers: bool = False, batches: tuple[int, ...] = BATCHES
) -> tuple[Any, int, int]:
    """The decoder-only LM exported with its static cache (``export_decoder``) at the batch
    (``cache_batch``) and the cache length asked or the model's: the program, its batch and its
    cache length. ``own_buffers``: the cache in its own buffers, for a runtime that keeps them
    between calls (AOTInductor, ExecuTorch); ``batches``: the target's default batch sizes.
    """
    from ptconvert import progress
    from ptconvert.convert.exporting import wrapper_mode

    batch = cache_batch(opts.batch_sizes, batches)
    length = cache_length(model, opts.cache_length)
    with progress.step(f"exporting with a static cache (batch {batch}, {length} positions)"):
        ep = export_decoder(
            model, batch, length, wrapper_mode(opts.strict), own_buffers=own_buffers
        )
        return ep, batch, length


def export_program(
    model: Any, src: Path, tmp: Path, out: Path, opts: Any, notes: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The decoder-only LM into a pt2 at ``tmp``, its static cache in lifted constants the
    module mutates, ``generation.json`` beside the program; the report's cache and interface
    (``src`` and ``out``: an AOTI package's, ``targets.Target``)."""
    from ptconvert import progress

    ep, batch, length = export_static(model, opts)
    meta = static_meta(model, opts, batch, length)
    with progress.step(f"writing {tmp.name}"):
        save_program(ep, tmp, meta)
    notes.append(
        f"static cache of {batch} row(s) × {length} positions inside the program (mutated "
        "buffers); a smaller batch runs padded with copies of its last row "
        "(ptconvert.generate does it)"
    )
    cache = {"kind": "static", "batch_size": batch, "length": length}
    interface = {
        "call": "prog(input_ids=ids[batch, n], cache_position=arange(pos, pos + n)) → logits",
        "inputs": ["input_ids", "cache_position"],
        "outputs": ["logits"],
    }
    return cache, interface


def export_decoder(
    model: Any, batch: int, length: int, mode: ExportMode, *, own_buffers: bool = False
) -> Any:
    """The decoder-only LM with a static cache of ``batch`` rows and ``length`` positions, as an
    ExportedProgram whose number of new tokens per call is dynamic (1 to ``length``), exported
    in ``mode`` (``--export-mode``).
    ``own_buffers``: the cache in the program's buffers (``_own_buffers``), as AOTInductor
    needs it (the aoti target's ``generation.py``); a ``.pt2``'s module keeps it in lifted
    constants."""
    import torch
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    from ptconvert.convert.exporting import export_in_mode

    generation = model.generation_config
    saved = generation.cache_implementation
    generation.cache_implementation = "static"  # the wrapper insists; eager generate must not
    config = model.config.get_text_config()
    heads = _falcon_cache_heads(config)
    if heads is not None:  # what the wrapper sizes the cache by, for its construction only
        config.num_key_value_heads = heads
    try:
        wrapper = TorchExportableModuleForDecoderOnlyLM(
            model, batch_size=batch, max_cache_len=length
        )
    finally:
        generation.cache_implementation = saved
        if heads is not None:
            del config.num_key_value_heads
    tokens = torch.export.Dim("sequence_length", min=1, max=length)
    example = min(5, length)
    try:
        with torch.no_grad():
            return export_in_mode(
                _own_buffers(wrapper.model) if own_buffers else wrapper.model,
                (),
                {
                    "input_ids": torch.zeros((batch, example), dtype=torch.long),
                    "cache_position": torch.arange(example),
                },
                {"input_ids": {1: tokens}, "cache_position": {0: tokens}},
                mode,
            )
    except Exception as exc:  # torch raises many kinds here: said, never an internal error
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise UnsupportedConversionError(
            f"{type(model).__name__} with a static cache does not export: "
            f"{type(exc).__name__}: {first}",
            hint="--to onnx writes it with past_key_values inputs (no static cache)",
        ) from None


def _falcon_cache_heads(config: Any) -> int | None:
    """The key/value heads a Falcon caches, where its config lacks the ``num_key_value_heads``
    transformers' wrapper sizes the static cache by (without it: every head): one for the
    multi-query attention of the first architecture (Falcon-7B), every head for the new one
    (keys and values are repeated before the cache), else ``num_kv_heads``; as
    ``modeling_falcon`` caches them. None for any other model."""
    if getattr(config, "model_type", None) != "falcon" or hasattr(config, "num_key_value_heads"):
        return None
    if config.new_decoder_architecture:
        return int(config.num_attention_heads)
    return 1 if config.multi_query else int(config.num_kv_heads)


def _own_buffers(inner: Any) -> Any:
    """transformers' ``TorchExportableModuleWithStaticCache`` in a module whose ``forward``
    points the cache layers at the wrapper's registered buffers (``key_cache_N``,
    ``value_cache_N``, ``cumulative_length_N``) before each call, as export traces them."""
    import torch

    point = _compat.hf.static_cache_pointer()

    class OwnBuffers(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, cache_position: Any) -> Any:
            point(self.inner)
            return self.inner(input_ids=input_ids, cache_position=cache_position)

    return OwnBuffers()


def static_meta(model: Any, opts: Any, batch: int, length: int, **more: Any) -> dict[str, Any]:
    """What an archive with a static cache says of itself (``generation.json``)."""
    return {
        "task": opts.task,
        "cache": "static",
        "batch_size": batch,
        "cache_length": length,
        "model_class": type(model).__name__,
        "eos_token_id": model.generation_config.eos_token_id,
        **more,
    }


def save_program(ep: Any, path: Path, meta: dict[str, Any]) -> None:
    """``torch.export.save`` through the atomic writer's guarded file, ``meta`` beside the
    program as the archive's ``generation.json``."""
    import torch

    from ptconvert.atomic import guarded_file

    with guarded_file(path) as fh:
        torch.export.save(ep, fh, extra_files={META_NAME: json.dumps(meta)})


def read_meta(path: Path) -> dict[str, Any] | None:
    """The ``generation.json`` of a pt2 archive (read from the zip, nothing loaded), or None."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith(f"/{META_NAME}")), None)
            if name is None:
                return None
            meta = json.loads(archive.read(name))
    except (OSError, zipfile.BadZipFile, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def describe_static(info: Any) -> None:
    """``info``'s task and cache of a program with a static cache (its ``generation.json``: a
    pt2's archive member, an AOTI package's)."""
    meta = read_meta(Path(info.path))
    if meta is not None and "task" in meta:
        info.metadata["task"] = meta["task"]
        info.metadata["cache"] = (
            f"static, batch {meta.get('batch_size')}, {meta.get('cache_length')} positions"
        )


def read_static(path: Path) -> dict[str, Any] | None:
    """The ``generation.json`` of a pt2 archive or an AOTI package with a static cache, else
    None."""
    meta = read_meta(path)
    return meta if meta is not None and meta.get("cache") == "static" else None


def open_program(path: Path, trust: bool) -> StaticCacheProgram | None:
    """The stepper of a pt2 with a static cache; None for another pt2 (``trust``: an AOTI
    package's, ``targets.Target``)."""
    meta = read_static(path)
    return None if meta is None else StaticCacheProgram(path, meta)


class StaticCacheProgram:
    """A pt2 program with a static cache (``export_decoder``'s), stepped token by token: a batch
    smaller than the program's is padded with copies of its last row, which are dropped again."""

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        from ptconvert.formats.pt2 import load_exported
        from ptconvert.scan.guard import guard

        guard(path)  # every load of a pickle goes through the scanner first
        self.module = load_exported(path).module()
        self._sized(path, meta)

    what = "program"  # what the messages call it

    def _sized(self, path: Path, meta: dict[str, Any]) -> None:
        self.batch = int(meta["batch_size"])
        self.length = int(meta["cache_length"])
        self.path = path
        self.rows = 0
        self.position = 0

    def _run(self, input_ids: Any, cache_position: Any) -> Any:
        return self.module(input_ids=input_ids, cache_position=cache_position)

    def _padded(self, ids: Any) -> Any:
        import torch

        missing = self.batch - ids.shape[0]
        return torch.cat([ids, ids[-1:].expand(missing, ids.shape[1])]) if missing else ids

    def _call(self, ids: Any) -> Any:
        import torch

        count = ids.shape[1]
        positions = torch.arange(self.position, self.position + count)
        logits = self._run(self._padded(ids), positions)
        self.position += count
        return logits[: self.rows, -1]

    def start(self, input_ids: Any, max_new_tokens: int) -> Any:
        rows, prompt = input_ids.shape
        if rows > self.batch:
            raise UsageError(
                f"the {self.what}'s static cache holds {self.batch} row(s), the prompt has {rows}",
                path=self.path,
                hint="export with --batch-sizes up to the batch you generate at",
            )
        if prompt + max_new_tokens - 1 > self.length:
            raise UsageError(
                f"{prompt} prompt tokens and {max_new_tokens} new ones do not fit the "
                f"{self.what}'s static cache of {self.length} positions",
                path=self.path,
                hint="export with a longer --cache-length",
            )
        self.rows, self.position = rows, 0
        return self._call(input_ids.long())

    def step(self, tokens: Any) -> Any:
        return self._call(tokens.long())
