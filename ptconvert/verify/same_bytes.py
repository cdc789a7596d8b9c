"""Two byte ranges of files compared in place: both mapped read-only a window at a time and
compared with libc's ``memcmp``, nothing copied into Python.

Reading both ranges with ``pread`` into buffers costs a copy of each byte out of the page cache
(about as long as ``cat`` of both files) before the comparison itself; a shared read-only map
populated up front (``MAP_POPULATE``) and ``memcmp`` take about half that. Each window is
unmapped once compared, so a thread holds at most two windows of the files however large they
are. ``first_differences`` compares many ranges in pieces on a few threads: ``memcmp`` and the
maps run without the GIL, and the check after a write is then bound by memory, not one core.
64-bit Linux and macOS (libc through ctypes); elsewhere :class:`Unmappable`, and the check reads
the bytes in chunks instead.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

WINDOW = 16 << 20  # bytes mapped from each file at a time (as fast as 64 MiB, a quarter of the RSS)
PIECE = 64 << 20  # what one thread compares at a time in ``first_differences``
WORKERS = 4  # at most: two threads compare 1 GiB in 0.07 s where one takes 0.115 s here

Pair = tuple[tuple[Path, int], tuple[Path, int], int]  # (file, offset) twice, and a length


class Unmappable(Exception):
    """The ranges cannot be mapped here (no libc, or a map refused): compare them another way."""


def first_difference(a: tuple[Path, int], b: tuple[Path, int], nbytes: int) -> int | None:
    """Where the ``nbytes`` bytes at ``a`` (a file, an offset) and at ``b`` first differ: the
    start of the first window that differs (or of the part a file lacks), None when equal."""
    libc = _libc()
    if libc is None:
        raise Unmappable("no libc")
    fds = [os.open(path, os.O_RDONLY) for path in (a[0], b[0])]
    try:
        # a map past a file's end faults on access: a short file differs where it ends
        short = [os.fstat(fd).st_size - at for fd, at in zip(fds, (a[1], b[1]), strict=True)]
        if min(short) < nbytes:
            return max(0, min(short))
        pos = 0
        while pos < nbytes:
            n = min(WINDOW, nbytes - pos)
            with (
                _mapped(libc, fds[0], a[1] + pos, n) as x,
                _mapped(libc, fds[1], b[1] + pos, n) as y,
            ):
                if libc.memcmp(x, y, n) != 0:
                    return pos
            pos += n
        return None
    finally:
        for fd in fds:
            os.close(fd)


def first_differences(pairs: list[Pair]) -> list[int | Unmappable | None]:
    """``first_difference`` of each pair, every pair cut in pieces of PIECE that up to WORKERS
    threads compare side by side (``memcmp`` and the maps run without the GIL; small pairs go
    together, about PIECE bytes a task): where each pair first differs, None where equal,
    ``Unmappable`` where it could not be compared so."""
    from concurrent.futures import ThreadPoolExecutor

    Piece = tuple[int, int]  # (pair, where in it)
    tasks: list[list[Piece]] = [[]]
    size = 0
    for i, (_, _, nbytes) in enumerate(pairs):
        for start in range(0, max(nbytes, 1), PIECE):
            if size >= PIECE:
                tasks.append([])
                size = 0
            tasks[-1].append((i, start))
            size += min(PIECE, nbytes - start)

    def compare(task: list[Piece]) -> list[int | Unmappable | None]:
        found: list[int | Unmappable | None] = []
        for i, start in task:
            (path_a, at_a), (path_b, at_b), nbytes = pairs[i]
            n = min(PIECE, nbytes - start)
            try:
                at = first_difference((path_a, at_a + start), (path_b, at_b + start), n)
            except (Unmappable, OSError) as exc:
                found.append(exc if isinstance(exc, Unmappable) else Unmappable(str(exc)))
                continue
            found.append(None if at is None else start + at)
        return found

    result: list[int | Unmappable | None] = [None] * len(pairs)
    workers = max(1, min(WORKERS, os.cpu_count() or 1, len(tasks)))
    with ThreadPoolExecutor(workers, thread_name_prefix="ptconvert-compare") as pool:
        try:
            for task, found in zip(tasks, pool.map(compare, tasks), strict=True):
                for (i, _), at in zip(task, found, strict=True):
                    prior = result[i]
                    if isinstance(prior, Unmappable) or at is None:
                        continue
                    if isinstance(at, Unmappable) or prior is None:
                        result[i] = at
                    else:
                        result[i] = min(prior, at)
        except BaseException:  # Ctrl-C, or a failure: the pieces not started are not run
            pool.shutdown(cancel_futures=True)
            raise
    return result


@contextmanager
def _mapped(libc: Any, fd: int, offset: int, nbytes: int) -> Iterator[int]:
    """The address of ``nbytes`` bytes of the file at ``offset``, mapped read-only meanwhile."""
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    length = nbytes + offset - start
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    addr = libc.mmap(None, length, mmap.PROT_READ, flags, fd, start)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        raise Unmappable(os.strerror(ctypes.get_errno() or errno.EINVAL))
    try:
        yield addr + offset - start
    finally:
        libc.munmap(addr, length)


@functools.cache
def _libc() -> Any:
    # mmap's offset is a 64-bit off_t on 64-bit Linux and macOS (a 32-bit build has mmap64)
    if not sys.platform.startswith(("linux", "darwin")) or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int64,
    ]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.memcmp.restype = ctypes.c_int
    libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return libc
