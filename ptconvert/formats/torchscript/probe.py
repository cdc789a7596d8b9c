"""A TorchScript archive's load, bounded: run first in a process of its own, under a time limit,
when the archive's code can run at load.

``torch.jit.load`` runs code of the file itself in one place: the scripted ``__setstate__`` of
a module or class, called while ``data.pkl`` is unpickled. The scanner lets such code through
when it only assigns attributes and calls allowlisted operators, but a loop among them may run
for as long as the archive's own saved state says: a scan-clean file that hangs every command
loading it. Default argument values and class-body constants, which the importer also evaluates,
are expressions without loops.

So before ptconvert loads an archive whose ``code/`` defines ``__setstate__`` in its own
process, the load is tried in a spawned child (which dies with its parent). A child that has not
finished within ``--load-timeout`` is killed and the load refused (``LoadTimeoutError``, exit 3);
one that finished (or failed: the load in this process then fails the same way, as before) lets
the caller load the file as it always did. Archives without ``__setstate__`` start no child. A
file that loaded in time is remembered for the rest of the process (by device, inode, size and
modification time): one command loading it several times pays for one child.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ptconvert.errors import PtconvertError

_CODE_MEMBER_LIMIT = 64 << 20  # a code member larger than this is not read: the load is tried
_FINISHED: set[tuple[int, int, int, int]] = set()  # files whose load finished in time


def load_in_time(path: str | Path, timeout: float | None = None) -> None:
    """Return once a ``torch.jit.load`` of the archive at ``path`` is known to finish within
    ``timeout`` seconds (``None``: the default of ``--load-timeout``): at once when its code
    defines no ``__setstate__`` (nothing of the file runs at load), else after a load in a
    spawned child finished in time. Raise ``LoadTimeoutError`` (exit 3) when it did not (the
    child is killed), ``CorruptFileError`` when the load killed its process. Call it only on a
    file the scan let through: the child loads it."""
    path = Path(path)
    limit = _default_timeout() if timeout is None else float(timeout)
    key = _identity(path)
    if key is not None and key in _FINISHED:
        return
    if _runs_code_at_load(path):
        _probe(path, limit)
    if key is not None:
        _FINISHED.add(key)


def _probe(path: Path, limit: float) -> None:
    from ptconvert.spawn import probe

    probe(_child, (str(path),), path=path, timeout=limit, what="torch.jit.load of this archive")


def _child(path: str, send: Any, parent: int) -> None:
    """The probe's process: import torch, then the load (spawn.serve_probe reports it)."""
    from ptconvert.spawn import serve_probe

    def prepare() -> None:
        import torch

        torch.set_num_threads(1)

    serve_probe(send, parent, prepare, lambda _: _tried(path))


def _tried(path: str) -> None:
    """torch.jit.load of the archive; a failure is not the probe's to report: the caller's own
    load then fails the same way, as it always did."""
    import torch

    try:
        torch.jit.load(path, map_location="cpu")
    except Exception:
        return


def _runs_code_at_load(path: Path) -> bool:
    """Whether a TorchScript code member of the archive (a ``.py`` under a ``code/`` folder,
    names compared ignoring case as torch's reader does) mentions ``__setstate__``; read
    without loading. True as well when the archive or a code member cannot be read: the child
    then finds out."""
    from ptconvert.archive import open_zip

    try:
        archive = open_zip(path)
        for member in archive.members:
            name = "/" + member.name.lower().replace("\\", "/")
            if "/code/" not in name or not name.endswith(".py"):
                continue
            if member.size > _CODE_MEMBER_LIMIT:
                return True
            if b"__setstate__" in archive.read(member):
                return True
    except (PtconvertError, OSError, ValueError):
        return True
    return False


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _default_timeout() -> float:
    from ptconvert.options import Options

    return float(Options.load_timeout)  # the field's default, as a class attribute
