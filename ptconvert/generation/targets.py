"""The generation targets, each declared once: how a model is exported to it, what a written one
says of itself (its task and static cache, read without loading it) and how it is stepped token
by token. A decoder-only LM is written as one file (``DECODER``: pt2, aoti, pte, onnx), a
seq2seq model as a folder (``FOLDER``: its layout, pt2 or onnx, told by its files' names).

The conversion (``convert.py``), ``ptconvert.generate`` (``runner.py``) and ``bench`` look a
target up here; the names of the targets a task accepts are ``tasks.TARGETS`` (said before the
model loads), and ``info``'s task lines (``tasks.describe_task``) read the file's own
description."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ptconvert.errors import UnsupportedConversionError
from ptconvert.generation import (
    aoti_cache,
    onnx_past,
    pte_cache,
    seq2seq,
    seq2seq_onnx,
    static_cache,
)
from ptconvert.options import Options


class Stepper(Protocol):
    """An artifact driven token by token: ``start`` feeds the prompt, ``step`` one new token per
    row; both return the logits of the last position (batch × vocabulary) as a torch tensor."""

    def start(self, input_ids: Any, max_new_tokens: int) -> Any: ...

    def step(self, tokens: Any) -> Any: ...


@dataclass(frozen=True)
class Target:
    name: str  # the format written (a folder: its layout)
    layout: str  # decoder (one file) | seq2seq (a folder)
    # (model, src, tmp, out, opts, notes) → the report's cache and interface: the model written
    # at tmp (the source directory src, the final path out: what an AOTI package's compile
    # reads), its notes added to notes
    export: Callable[
        [Any, Path, Path, Path, Options, list[str]], tuple[dict[str, Any], dict[str, Any]]
    ]
    # a written one's task, and its static cache's batch_size and cache_length; None: not one
    read: Callable[[Path], dict[str, Any] | None]
    # (path, trust) → its stepper (trust: an AOTI package's native code loads); None: not one
    open: Callable[[Path, bool], Stepper | None]
    static: bool = True  # a static cache of fixed rows and positions (else past inputs)
    requires: str | None = None  # the package said missing before the model loads


DECODER = {
    t.name: t
    for t in (
        Target(
            "pt2",
            "decoder",
            static_cache.export_program,
            static_cache.read_static,
            static_cache.open_program,
        ),
        # the static-cache program compiled by AOTInductor
        Target(
            "aoti",
            "decoder",
            aoti_cache.export_package,
            static_cache.read_static,
            aoti_cache.open_package,
        ),
        # the static-cache program lowered by ExecuTorch
        Target(
            "pte",
            "decoder",
            pte_cache.export_program,
            pte_cache.read_meta,
            pte_cache.open_program,
            requires="executorch",
        ),
        Target(
            "onnx",
            "decoder",
            onnx_past.export_with_past,
            onnx_past.read_meta,
            onnx_past.open_decoder,
            static=False,
        ),
    )
}
FOLDER = {
    t.name: t
    for t in (
        Target("pt2", "seq2seq", seq2seq.export_folder, seq2seq.read_folder, seq2seq.open_folder),
        Target(
            "onnx",
            "seq2seq",
            seq2seq_onnx.export_folder,
            seq2seq_onnx.read_folder,
            seq2seq_onnx.open_folder,
            static=False,
        ),
    )
}


def target_of(path: Path) -> tuple[str, Target | None]:
    """A written artifact's format and its target (None: no generation export is written so),
    from what it holds, never its name: a folder by its files' names, else by detection (whose
    errors it raises)."""
    from ptconvert.formats import detect
    from ptconvert.generation.seq2seq_folder import layout

    folder = layout(path)
    if folder is not None:
        return folder, FOLDER[folder]
    fmt = detect(path).format
    return fmt, DECODER.get(fmt)


def open_stepper(artifact: str | Path, trust: bool = False) -> Stepper:
    """The stepper for a written artifact, from what it holds (never its name); ``trust`` lets
    an AOTI package's native code load (``--trust``)."""
    path = Path(artifact)
    fmt, target = target_of(path)
    stepper = target.open(path, trust) if target is not None else None
    if stepper is None:
        raise UnsupportedConversionError(
            f"{fmt} without a generation layout (a pt2, AOTI package or .pte with a static "
            "cache, an ONNX decoder with past_key_values inputs, a seq2seq export's folder)",
            path=path,
            hint="convert with --task text-generation-with-past or text2text-generation-with-past",
        )
    return stepper
