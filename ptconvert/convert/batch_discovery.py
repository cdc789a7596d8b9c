"""The models a batch converts: every model under a folder (a Hugging Face directory as one, a
sharded index for its shards, each file ptconvert recognises), and where each one's output goes
in the output folder (as a single conversion would name it beside its source).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ptconvert.atomic import disk_size
from ptconvert.errors import InputError, PtconvertError
from ptconvert.options import Options


def is_batch(src: str | Path) -> bool:
    """A folder that is not itself one model (a Hugging Face directory is one)."""
    from ptconvert.formats import detect

    path = Path(src)
    if not path.is_dir():
        return False
    try:
        detect(path)
    except InputError:
        return True
    return False


def models_under(root: Path, skip: Path | None = None) -> list[Path]:
    """Every model under ``root`` in a stable order: a model directory (Hugging Face) as one,
    a sharded index for its shards, and each file ptconvert recognises. A file that carries a
    model suffix but cannot be recognised is listed too, so the batch reports it as broken.
    Symlinked folders are followed (each real folder once); ``skip`` (the outputs' folder)
    and hidden names are left out."""
    from ptconvert.formats import FORMATS, detect
    from ptconvert.formats.sharded import shard_paths

    suffixes = tuple(s for f in FORMATS for s in f.suffixes)
    skipped = skip.resolve() if skip is not None else None
    seen: set[Path] = set()
    found: list[Path] = []
    for dirpath, dirs, files in os.walk(root, followlinks=True):
        here = Path(dirpath)
        real = here.resolve()
        if real in seen or real == skipped:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if here != root and _is_model(here, detect):
            found.append(here)
            dirs[:] = []
            continue
        shards = {
            _real(p) for f in files if f.endswith(".index.json") for p in shard_paths(here / f)
        }
        for name in sorted(files):
            path = here / name
            resolved = _real(path)
            if name.startswith(".") or (resolved is not None and resolved in shards):
                continue
            # a link loop is listed too: its conversion says so (the rest converts)
            if resolved is None or _is_model(path, detect) or name.lower().endswith(suffixes):
                found.append(path)
    return found


def _real(path: Path) -> Path | None:
    """The path with every link resolved; None for a symbolic link loop."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # RuntimeError: Python < 3.13 says a loop so
        return None


def _is_model(path: Path, detect: Callable[[Path], Any]) -> bool:
    try:
        detect(path)
    except PtconvertError:
        return False
    return True


def output_names(
    sources: list[Path], root: Path, out_dir: Path, to: str, opts: Options
) -> list[Path]:
    """Each source's output under ``out_dir``, named and placed as a single conversion would
    put it beside the source; sources that would share a name keep their whole name."""
    from ptconvert.convert.output_naming import output_for

    outs = []
    for src in sources:
        beside = output_for(src, to, opts)
        inside = beside.is_relative_to(root) and beside != root
        outs.append(out_dir / (beside.relative_to(root) if inside else beside.name))
    clash = {o for o in outs if outs.count(o) > 1}
    return [
        o.with_name(f"{s.name}-{o.name}") if o in clash else o
        for s, o in zip(sources, outs, strict=True)
    ]


def source_size(src: Path) -> int:
    """Bytes the conversion reads: a shard index counts its shards."""
    from ptconvert.formats.sharded import shard_paths

    shards = shard_paths(src) if src.name.endswith(".index.json") else []
    return disk_size(src) + sum(disk_size(s) for s in shards)
