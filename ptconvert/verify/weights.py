"""Bitwise verification of a weights conversion, reading the output back from disk.

Every tensor must come back with the same name (after the declared renames), dtype, shape and
bytes; tied entries must resolve to the same data. The output is read once, in chunks; the
source bytes are read again from the source file (normally still in the page cache).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ptconvert.convert.weights_read import ByteRange, WeightEntry, WeightSet, read_weights
from ptconvert.convert.weights_write import tensor_bytes
from ptconvert.errors import VerificationError
from ptconvert.report import Report

CHUNK = 16 << 20


@dataclass
class WeightsCheck(Report):
    status: str  # "pass" | "skipped"
    tensors: int = 0
    bytes_compared: int = 0
    aliases: int = 0
    problems: list[str] = field(default_factory=list)


def _resolve(ws: WeightSet) -> dict[str, WeightEntry]:
    by_name = {e.name: e for e in ws.entries}
    return {e.name: by_name[e.alias_of] if e.alias_of is not None else e for e in ws.entries}


class _RangeReader:
    def __init__(self, source: ByteRange, nbytes: int, fds: dict[Path, int]) -> None:
        if source.path not in fds:
            fds[source.path] = os.open(source.path, os.O_RDONLY)
        self.fd, self.offset, self.nbytes = fds[source.path], source.offset, nbytes

    def read(self, pos: int, n: int, buf: bytearray) -> int:
        return os.preadv(self.fd, [memoryview(buf)[:n]], self.offset + pos)


def _chunks(entry: WeightEntry, fds: dict[Path, int]) -> _RangeReader | memoryview:
    if entry.source is None:
        return tensor_bytes(entry.tensor)
    return _RangeReader(entry.source, entry.nbytes, fds)


def _fill(obj: object, pos: int, n: int, buf: bytearray) -> int:
    """Put bytes [pos, pos+n) of a range or tensor into the reused ``buf``; return the count."""
    if isinstance(obj, _RangeReader):
        return obj.read(pos, n, buf)
    assert isinstance(obj, memoryview)
    buf[:n] = obj.cast("B")[pos : pos + n]
    return n


def _same_chunk(a: object, b: object, pos: int, n: int, bufs: tuple[bytearray, bytearray]) -> bool:
    if _fill(a, pos, n, bufs[0]) != n or _fill(b, pos, n, bufs[1]) != n:
        return False
    # whole buffers compare with memcmp; only the last, partial chunk is sliced
    return bufs[0] == bufs[1] if n == CHUNK else bufs[0][:n] == bufs[1][:n]


def verify_weights(source: WeightSet, output: Path) -> WeightsCheck:
    """Read ``output`` back and compare it with ``source``; VerificationError on a mismatch."""
    back = read_weights(output, keep_prefix=True)
    src, dst = _resolve(source), _resolve(back)
    problems: list[str] = []
    missing = sorted(set(src) - set(dst))
    extra = sorted(set(dst) - set(src))
    if missing:
        problems.append(f"missing in output: {missing[:10]}")
    if extra:
        problems.append(f"not in source: {extra[:10]}")
    fds: dict[Path, int] = {}
    bufs = (bytearray(CHUNK), bytearray(CHUNK))
    compared: set[tuple[str, str]] = set()
    total = 0
    try:
        for name in sorted(set(src) & set(dst)):
            a, b = src[name], dst[name]
            if (a.dtype, tuple(a.shape)) != (b.dtype, tuple(b.shape)):
                problems.append(f"{name}: {a.dtype}{list(a.shape)} became {b.dtype}{list(b.shape)}")
                continue
            if (a.name, b.name) in compared:
                continue
            compared.add((a.name, b.name))
            ra, rb = _chunks(a, fds), _chunks(b, fds)
            for pos in range(0, a.nbytes, CHUNK):
                n = min(CHUNK, a.nbytes - pos)
                if not _same_chunk(ra, rb, pos, n, bufs):
                    problems.append(f"{name}: bytes differ within [{pos}, {pos + n})")
                    break
            total += a.nbytes
    finally:
        for fd in fds.values():
            os.close(fd)
    if problems:
        raise VerificationError(
            "the output does not hold the same tensors: " + "; ".join(problems[:5]),
            path=output,
        )
    aliases = sum(1 for e in back.entries if e.alias_of is not None)
    return WeightsCheck("pass", len(src), total, aliases)
