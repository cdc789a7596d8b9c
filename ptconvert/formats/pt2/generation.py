"""What the pt2 target writes for a generation task: a decoder-only LM's program with a static
cache (``generation/static_cache.py``), a seq2seq model's folder of ``encoder.pt2`` and
``decoder.pt2`` (``generation/seq2seq.py``)."""

from __future__ import annotations

from typing import Any

from ptconvert.formats.pt2 import ExportedProgramFormat
from ptconvert.generation import seq2seq, static_cache
from ptconvert.generation.seq2seq_folder import DECODER_PT2, ENCODER_PT2
from ptconvert.generation.targets import Target


def describe_folder(info: Any) -> None:
    """The decoder's ``generation.json``: the task and its static self-attention cache."""
    from pathlib import Path

    meta = static_cache.read_meta(Path(info.path) / DECODER_PT2) or {}
    info.metadata["task"] = meta.get("task", info.metadata.get("task"))
    if meta.get("cache") == "static":
        info.metadata["cache"] = (
            f"static, batch {meta.get('batch_size')}, {meta.get('cache_length')} positions "
            f"({DECODER_PT2}'s self-attention; cross-attention from the encoder's states)"
        )


_NAME = ExportedProgramFormat.name
TARGETS = [
    Target(
        _NAME,
        "decoder",
        static_cache.export_program,
        static_cache.read_static,
        static_cache.open_program,
        describe=static_cache.describe_static,
    ),
    Target(
        _NAME,
        "seq2seq",
        seq2seq.export_folder,
        seq2seq.read_folder,
        seq2seq.open_folder,
        files=(ENCODER_PT2, DECODER_PT2),
        describe=describe_folder,
    ),
]
