"""Atomic outputs: write to a temporary path beside the target, rename into place on success.

A failed or interrupted run leaves nothing half-written; an existing output is replaced only
with ``force``; an input is never an output.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from ptconvert.errors import OutputExistsError, UsageError


def open_output(path: Path) -> BinaryIO:
    """Open a new (or just-created, empty) output for writing, without O_TRUNC.

    ext4 flushes a file that was truncated when it is closed (auto_da_alloc), which would add a
    synchronous write-back of the whole output to every conversion.
    """
    if path.exists():
        if path.stat().st_size:
            raise UsageError("refusing to write over a non-empty file", path=path)
        return open(path, "r+b")
    return open(path, "xb")


def check_output(output: Path, inputs: list[Path], force: bool) -> None:
    """Refuse to overwrite an input, or an existing output without ``force``."""
    for src in inputs:
        if output.exists() and src.exists() and os.path.samefile(output, src):
            raise UsageError("the output would overwrite the input", path=output)
    if output.exists() and not force:
        raise OutputExistsError(
            "the output already exists", path=output, hint="pass --force to replace it"
        )


@contextmanager
def atomic_path(output: Path, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``output``; rename it onto ``output`` if the block succeeds."""
    output.parent.mkdir(parents=True, exist_ok=True)
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    else:
        # keep the suffix: some writers (torch.export.save) insist on it
        fd, name = tempfile.mkstemp(
            prefix=f".{output.name}.", suffix=f".tmp{output.suffix}", dir=output.parent
        )
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        # mkstemp/mkdtemp create private (0600/0700) paths: give the output the usual mode
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod((0o777 if tmp.is_dir() else 0o666) & ~umask)
        if directory and output.exists():
            # a directory cannot be renamed over a non-empty one: move the old one aside first
            old = output.with_name(f".{output.name}.old")
            os.replace(output, old)
            os.replace(tmp, output)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, output)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


def place_together(moves: list[tuple[Path, Path]], obsolete: Sequence[Path] = ()) -> None:
    """Rename each (written, destination) pair into place, the last pair last (the main file:
    once it is there, what it refers to is too), then remove ``obsolete`` files (a replaced
    output's companions that the new one does not have). Same filesystem: each rename is
    atomic."""
    for written, destination in moves:
        os.replace(written, destination)
    for path in obsolete:
        path.unlink(missing_ok=True)


def disk_size(path: Path) -> int:
    """Bytes of a file, or of every file under a folder (symlinks not followed); 0 when
    nothing is there (a dangling link)."""
    try:
        if not path.is_dir():
            return path.stat().st_size
        return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    except OSError:
        return 0
