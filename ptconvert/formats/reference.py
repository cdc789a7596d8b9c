"""The independent reading of a weights source, as the bitwise check compares an output with
it: each format's ``reference`` (another implementation than its ``read_weights``, so that a blind
spot of ptconvert's own reader cannot pass its own check) gives a Reference — every tensor's
dtype, shape and its bytes in chunks. The pages a loader maps are dropped from this process once
compared, so memory stays flat whatever the size."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert.errors import VerificationError
from ptconvert.formats.weightset import WeightSet

CHUNK = 2 << 20
DROP_EVERY = CHUNK  # bytes read through a loader's mapping between two page drops


@dataclass
class Ref:
    """A tensor as the independent reader sees it; ``chunks`` yields its bytes in order.
    ``span`` (a file and an offset) where the reader found them stored in a file as they are,
    so that the check can compare the two files' bytes in place."""

    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    chunks: Callable[[], Iterator[memoryview]]
    span: tuple[Path, int] | None = None


@dataclass
class Reference:
    reader: str
    tensors: dict[str, Ref]
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0


def file_range(fd: int, offset: int, nbytes: int) -> Callable[[], Iterator[memoryview]]:
    """A byte range of an open file, read with ``pread`` into one reused buffer of CHUNK bytes
    (each chunk is compared before the next is read)."""

    def chunks() -> Iterator[memoryview]:
        buf = memoryview(bytearray(min(CHUNK, nbytes)))
        pos = 0
        while pos < nbytes:
            n = os.preadv(fd, [buf[: min(CHUNK, nbytes - pos)]], offset + pos)
            if n <= 0:
                return
            yield buf[:n]
            pos += n

    return chunks


def torch_ref(t: Any, pages: Pages | None = None) -> Ref:
    import torch

    dtype = str(t.dtype).removeprefix("torch.")
    nbytes = t.numel() * t.element_size()

    def chunks() -> Iterator[memoryview]:
        if nbytes == 0:
            return
        flat = t.detach()
        if not flat.is_contiguous():
            flat = flat.contiguous()
        data = memoryview(flat.reshape(-1).view(torch.uint8).numpy()).cast("B")
        read = 0
        for pos in range(0, nbytes, CHUNK):
            yield data[pos : pos + CHUNK]
            read += CHUNK
            if pages is not None and read >= DROP_EVERY:
                pages.drop()
                read = 0
        if pages is not None:
            pages.drop()

    return Ref(dtype, tuple(t.shape), nbytes, chunks)


def program_reference(
    ws: WeightSet, may_load: bool, load_state: Callable[[], dict[str, Any]], reader: str
) -> Reference:
    """A program's own loader and its state dict (``load_state``), run only on a scan-clean
    file (``may_load``: the scan found it clean, or --trust)."""
    assert ws.origin is not None
    if not may_load:
        raise VerificationError(
            "the program is not scan-clean, so it is not loaded to check its weights",
            path=ws.origin,
            hint="pass --no-verify to convert without the check",
        )
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = load_state()
    tensors = {n: torch_ref(t.detach()) for n, t in state.items()}
    return Reference(f"{reader} after a clean scan", tensors, [])


class Pages:
    """Drops the pages of ``path`` that are mapped into this process from its resident set.

    The reference loaders read the source through their own memory maps; every page they touch
    would otherwise stay resident until the map is closed. Only mappings of exactly this file are
    advised, each time looked up afresh (a map closed meanwhile is never touched). Linux only;
    elsewhere a no-op."""

    def __init__(self, path: Path) -> None:
        self.path = os.path.realpath(path)
        self.madvise = _libc_madvise()

    def drop(self) -> None:
        if self.madvise is None:
            return
        try:
            with open("/proc/self/maps") as fh:
                lines = fh.readlines()
        except OSError:
            return
        for line in lines:
            if not line.rstrip("\n").endswith(self.path):  # most lines: split none of them
                continue
            parts = line.split(None, 5)
            if len(parts) < 6 or parts[5].rstrip("\n") != self.path:
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            self.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), mmap.MADV_DONTNEED)


def _libc_madvise() -> Any:
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_DONTNEED"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn
