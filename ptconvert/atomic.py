"""Atomic outputs: written in a private folder beside the target, renamed into place on success.

A failed or interrupted run leaves nothing half-written: the work happens in a folder named
``.NAME.PID-HOST-RANDOM.ptconvert-tmp`` beside the output (same filesystem, so the rename is
atomic), locked while its process lives and removed on every exit Python sees; the folders of
runs that were killed (``kill -9``, a dead worker) are removed by the next run that writes
there. An existing output is replaced only with ``replace`` (``--force``), and one that another
process wrote meanwhile never is; an input is never an output. Failures of the filesystem
(no space, read-only, permission, a file where a folder should be) are named errors that name
the output, never the temporary path.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import io
import os
import re
import shutil
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from ptconvert.errors import (
    NoSpaceError,
    NotAFolderError,
    OutputExistsError,
    PtconvertError,
    UsageError,
    named_error,
)

TEMP_SUFFIX = ".ptconvert-tmp"
STALE_AFTER_S = 60  # an unlocked temporary folder untouched this long belongs to a dead run
_TEMP_NAME = re.compile(r"^\..*\.(\d+)-([0-9a-f]{6})-[a-z0-9_]+" + re.escape(TEMP_SUFFIX) + "$")


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
        if output.is_dir() and src.exists() and src.resolve().is_relative_to(output.resolve()):
            raise UsageError(  # replacing the folder would delete the input with it
                f"the output folder holds the input {src}: replacing it would delete the input",
                path=output,
                hint="write the output somewhere else",
            )
    if output.exists() and not force:
        raise OutputExistsError(
            "the output already exists", path=output, hint="pass --force to replace it"
        )


@contextmanager
def atomic_path(output: Path, *, directory: bool = False, replace: bool = False) -> Iterator[Path]:
    """Yield a path (an empty file, or an empty folder) in a private folder beside ``output``,
    under ``output``'s own name (writers that insist on a suffix get it); when the block
    succeeds it is renamed onto ``output``: over an existing one only with ``replace``."""
    with temp_folder(output) as folder:
        tmp = folder / output.name
        if directory:
            tmp.mkdir()
        else:
            tmp.touch(exist_ok=False)
        yield tmp
        # a writer may have put its own file there: give the output the usual mode
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod((0o777 if tmp.is_dir() else 0o666) & ~umask)
        publish(tmp, output, replace=replace)


@contextmanager
def temp_folder(beside: Path, *, name: Path | None = None) -> Iterator[Path]:
    """A private folder beside ``beside`` (on its filesystem: what is written there renames
    into place), locked while this process uses it and removed when the block ends, however it
    ends; the stale folders of killed runs there are removed first (``sweep``). A failure of
    the filesystem in the block is a named error naming ``name`` (default ``beside``) where the
    system named the temporary folder or something in it."""
    shown = name or beside
    made = _missing_folders(beside.parent)  # made for the output: removed again if it fails
    try:
        make_folder(beside.parent)
        sweep(beside.parent)
        prefix = f".{beside.name[:100]}.{os.getpid()}-{_host()}-"
        folder = Path(tempfile.mkdtemp(prefix=prefix, suffix=TEMP_SUFFIX, dir=beside.parent))
        lock = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        done = False
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a sweep by another run leaves it alone
            yield folder
            done = True
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            os.close(lock)
            if not done:
                _remove_empty(made)
    except PtconvertError as exc:
        if exc.path is not None and _ours(exc.path, beside):
            exc.path = str(shown)  # the temporary path is gone: name the user's
        raise
    except OSError as exc:
        if exc.errno in (None, errno.ENOMEM):
            raise  # not the filesystem's (out of memory is said where the input is known)
        mine = all(n is None or _ours(n, beside) for n in (exc.filename, exc.filename2))
        raise named_error(exc, shown if mine else None) or exc from exc


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its parents that do not exist yet, deepest first."""
    missing = []
    for p in [folder, *folder.parents]:
        if p.exists():
            break
        missing.append(p)
    return missing


def _remove_empty(folders: list[Path]) -> None:
    """Folders a failed write made, deepest first, each only while it is empty: nothing of the
    failure stays, nothing another process put there goes."""
    for p in folders:
        try:
            p.rmdir()
        except OSError:
            return


def _ours(name: str | bytes | Path, beside: Path) -> bool:
    """Whether a path an error names is ``beside`` or lies in a temporary folder beside it."""
    path = Path(os.fsdecode(name))
    if path == beside:
        return True
    try:
        first = path.relative_to(beside.parent).parts[0]
    except (ValueError, IndexError):
        return False
    return _TEMP_NAME.match(first) is not None


def make_folder(folder: Path) -> None:
    """Create ``folder`` and its parents; a file in the way is a named error naming it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocking = next((p for p in [folder, *folder.parents] if p.exists()), folder)
        raise NotAFolderError(
            f"is a file, not a folder: nothing can be written in {folder}",
            path=blocking,
            hint="choose an output path whose folders are folders",
        ) from None


def sweep(folder: Path) -> list[Path]:
    """Remove the temporary folders of dead runs in ``folder``: named as ``temp_folder`` names
    them, owned by this user, not locked (the lock dies with its process), and either of a
    process of this host that is gone or untouched for ``STALE_AFTER_S``. Returns them."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for name in names:
        match = _TEMP_NAME.match(name)
        if match is None:
            continue
        path = folder / name
        try:
            st = path.lstat()
        except OSError:
            continue
        if st.st_uid != os.getuid() or not stat.S_ISDIR(st.st_mode):
            continue
        gone = match[2] == _host() and not _alive(int(match[1]))
        if (gone or _untouched(path, st.st_mtime)) and _remove_unlocked(path):
            removed.append(path)
    return removed


def _host() -> str:
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:6]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: alive
    return True


def _untouched(folder: Path, mtime: float) -> bool:
    """Nothing in ``folder`` (itself or what it holds) changed for ``STALE_AFTER_S``."""
    try:
        newest = max([mtime, *(p.lstat().st_mtime for p in folder.iterdir())])
    except OSError:
        return False
    return time.time() - newest > STALE_AFTER_S


def _remove_unlocked(folder: Path) -> bool:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False  # its process is alive (on another host, or a reused pid)
    try:
        shutil.rmtree(folder, ignore_errors=True)
    finally:
        os.close(fd)
    return True


_WRITE = 2  # sync_file_range(2)'s SYNC_FILE_RANGE_WRITE: start writing dirty pages, no wait


def start_writeback(paths: Sequence[Path]) -> threading.Thread | None:
    """Start writing these finished files to disk now, on a thread of its own, while the check
    reads them back from the page cache: the ``sync`` (or the next reader after a crash) that
    follows a conversion then finds them written instead of writing a gibibyte after it. The
    call submits the writes and waits for none of them (it blocks only while it queues them:
    0.3 s for 1 GiB here, beside the check); nothing is made durable that way — a file never
    written is as safe as before. A libc without ``sync_file_range`` (not Linux): no thread."""
    call = getattr(ctypes.CDLL(None, use_errno=True), "sync_file_range", None)
    if call is None or not paths:
        return None

    def write_back() -> None:
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:  # ctypes lets go of the GIL for the call: the check runs beside it
                call(fd, ctypes.c_longlong(0), ctypes.c_longlong(0), ctypes.c_uint(_WRITE))
            finally:
                os.close(fd)

    thread = threading.Thread(target=write_back, name="ptconvert-writeback", daemon=True)
    thread.start()
    return thread


# renameat2(2) flags
_NOREPLACE, _EXCHANGE = 1, 2


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """``renameat2``; False where this libc or filesystem has no such call (then the caller
    falls back), an OSError for any other failure."""
    call = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if call is None:
        return False
    at_cwd = -100
    if call(at_cwd, os.fsencode(src), at_cwd, os.fsencode(dst), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(src), None, str(dst))


def publish(src: Path, dst: Path, *, replace: bool) -> None:
    """Rename ``src`` onto ``dst``. Without ``replace`` a path that exists there, even one
    another process created a moment ago, is never replaced (OutputExistsError); with it, a
    file is replaced and a folder exchanged with the old one (which is left at ``src``)."""
    if replace:
        if dst.is_dir() and not dst.is_symlink() and src.is_dir():
            if not _renameat2(src, dst, _EXCHANGE):
                # no atomic exchange here: the old folder is moved aside first
                old = src.with_name(f"{src.name}.old")
                os.replace(dst, old)
                os.replace(src, dst)
                os.replace(old, src)
            return
        os.replace(src, dst)
        return
    try:
        if not _renameat2(src, dst, _NOREPLACE):
            _rename_noreplace_fallback(src, dst)
    except FileExistsError:
        raise OutputExistsError(
            "the output appeared while this run was writing it (another process?): it is "
            "kept as it is",
            path=dst,
            hint="pass --force to replace it",
        ) from None


def _rename_noreplace_fallback(src: Path, dst: Path) -> None:
    """Without renameat2: a file is linked (which never replaces) and its temporary name
    removed; a folder is renamed when nothing is there (a window remains)."""
    if src.is_dir():
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
        os.rename(src, dst)
        return
    os.link(src, dst)
    os.unlink(src)


def place_together(
    moves: list[tuple[Path, Path]], obsolete: Sequence[Path] = (), *, replace: bool = True
) -> None:
    """Rename each (written, destination) pair into place, the last pair last (the main file:
    once it is there, what it refers to is too), then remove ``obsolete`` files (a replaced
    output's companions that the new one does not have). Same filesystem: each rename is
    atomic. Without ``replace`` nothing there is replaced (``publish``); when one pair cannot
    be placed, those placed before it are taken back."""
    placed: list[Path] = []
    try:
        for written, destination in moves:
            publish(written, destination, replace=replace)
            placed.append(destination)
    except BaseException:
        if not replace:  # what was placed is this run's own (nothing was replaced)
            for path in placed:
                path.unlink(missing_ok=True)
        raise
    for path in obsolete if replace else ():
        path.unlink(missing_ok=True)


def ensure_space(folder: Path, needed: int, path: Path, *, estimate: bool = False) -> None:
    """Refuse, before it starts, a write of ``needed`` bytes into ``folder`` that its
    filesystem has no room for: a NoSpaceError naming ``path``, the bytes needed and free."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return  # the write itself will say what is wrong
    free = st.f_bavail * st.f_frsize
    if needed > free:
        about = "about " if estimate else ""
        raise NoSpaceError(
            f"no space left on the device: writing it needs {about}{needed:,} bytes "
            f"({needed / 2**20:.1f} MiB) and {free:,} bytes ({free / 2**20:.1f} MiB) are free "
            "on its filesystem",
            path=path,
            hint="free space there, or write elsewhere with -o",
        )


class _Guarded(io.IOBase):
    """A file object whose writes never raise: the first failure is kept (and what follows
    dropped) to be raised once the writer is done (``guarded_file``)."""

    def __init__(self, fh: BinaryIO) -> None:
        super().__init__()
        self.fh = fh
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        if self.error is None:
            try:
                self.fh.write(data)
            except OSError as exc:
                self.error = exc
        return memoryview(data).nbytes

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        # torch skips the bytes of a record it writes later ([Note: write_record_metadata])
        return self.fh.seek(offset, whence) if self.error is None else 0

    def tell(self) -> int:
        return self.fh.tell()

    def flush(self) -> None:
        if self.error is None and not self.fh.closed:
            try:
                self.fh.flush()
            except OSError as exc:  # kept as a write's failure is
                self.error = exc

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True


@contextmanager
def guarded_file(path: Path) -> Iterator[Any]:
    """``path`` opened for a writer that must never see a failed write. torch's C++ zip writer
    (``torch.export.save``, ``torch.jit.save``) throws when a write fails and throws again
    from its destructor, which ends the process (SIGABRT); handed this file object it writes
    through Python, a failure (no space) is kept, and raised here as the OSError once the
    writer returned."""
    fh = open_output(path)
    guarded = _Guarded(fh)
    try:
        yield guarded
    finally:
        try:
            fh.close()  # flushes what is buffered: a failure there is a failed write too
        except OSError as exc:
            guarded.error = guarded.error or exc
    if guarded.error is not None:
        code = guarded.error.errno or errno.EIO
        raise OSError(code, os.strerror(code), str(path)) from guarded.error


def disk_size(path: Path) -> int:
    """Bytes of a file, or of every file under a folder (symlinks not followed); 0 when
    nothing is there (a dangling link)."""
    try:
        if not path.is_dir():
            return path.stat().st_size
        return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    except OSError:
        return 0
