"""The generation targets, each declared by its target's package (``formats/<t>/generation``,
read through ``Format.generation_targets``): how a model is exported to it, what a written one
says of itself (its task and static cache, read without loading it), what ``info`` says of it,
and how it is stepped token by token. A decoder-only LM is written as one file (layout
``decoder``), a seq2seq model as a folder (``seq2seq``: its files tell which target wrote it).

The conversion (``convert.py``), ``ptconvert.generate`` (``runner.py``) and ``bench`` look a
target up here (``targets``); ``tasks`` says which ones a task accepts (before the model loads)
and ``info``'s task lines (``tasks.describe_task``) come from the target's ``describe``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ptconvert.errors import UnsupportedConversionError
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
    files: tuple[str, ...] = ()  # a folder's files, its configs aside (seq2seq)
    # written beside them, not needed to read one back (a folder written before them lacks them)
    extra_files: tuple[str, ...] = ()
    # ``info``'s lines about a written one: its task and cache into the FileInfo's metadata
    describe: Callable[[Any], None] | None = None
    # a decoder its client loads from a folder (its format's ``folder_file`` beside the source's
    # config.json, generation_config.json and tokenizer files; convert/output_naming): that
    # client, in words
    client: str = ""
    # without --batch-sizes: the batch sizes it is written for (a static cache's rows: the
    # largest) and checked at; its client's (ExecuTorch's LLM runners feed one row)
    batches: tuple[int, ...] = (1, 2)
    # the check in its client's own runner, where that client is installed: (model, the
    # written artifact, the source directory, options) → the report's one note (it ran and
    # matched, or why it did not run); a difference raises VerificationError. None: no such
    # client. The conversion's check calls it after its own (``convert.py``)
    client_check: Callable[[Any, Path, Path, Options], str] | None = None


def targets(layout: str) -> dict[str, Target]:
    """The generation targets of ``layout`` (decoder | seq2seq) the registered formats declare,
    by the name of the format written."""
    from ptconvert.formats import FORMATS

    return {t.name: t for f in FORMATS for t in f.generation_targets() if t.layout == layout}


def folder_target(path: Path) -> Target | None:
    """The target whose folder ``path`` is (a seq2seq export: all of its files are there)."""
    if not path.is_dir():
        return None
    found = (t for t in targets("seq2seq").values() if all((path / f).is_file() for f in t.files))
    return next(found, None)


def target_of(path: Path) -> tuple[str, Target | None]:
    """A written artifact's format and its target (None: no generation export is written so),
    from what it holds, never its name: a folder by its files' names, else by detection (whose
    errors it raises)."""
    from ptconvert.formats import detect

    folder = folder_target(path)
    if folder is not None:
        return folder.name, folder
    fmt = detect(path).format  # a decoder's client folder too (ONNX: model.onnx, config.json)
    return fmt, targets("decoder").get(fmt)


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
