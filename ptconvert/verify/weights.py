"""Bitwise verification of a weights conversion against an independent reading of the source.

The output is read back with ptconvert's own reader; the source is read again by another
implementation, its format's ``reference`` (pickle checkpoints: stdlib ``pickle`` and ``zipfile``
through ``pickles/stdlib_checkpoint.py``, which imports and calls nothing a pickle names, with or
without ``--trust``; ``safe_open`` for safetensors; the program's own loader after a clean scan;
the onnx package for ONNX), so that a blind spot of ptconvert's symbolic reader, a tensor it cannot
see, cannot pass its own check. Names (after the declared
unwrap, prefix strip and aliases), dtypes, shapes and bytes must agree; tensors left out on purpose
(``--skip-unsupported``) are excluded by name, with whatever lies under that name.

Memory stays flat whatever the size. A tensor that both files store as it is (the reference
reader gives its place in the source, ptconvert's reader its place in the output) is compared in
place, a window of both files mapped at a time and compared with ``memcmp``
(``verify/same_bytes.py``: half the time of reading both into buffers; pieces of the tensors on
a few threads side by side). Any other is compared in
chunks: the output read with ``pread``, and the pages of the source that a reference reader maps
into the process dropped from it once compared (``madvise(MADV_DONTNEED)`` on that file's
read-only mappings: they are read again from the page cache when touched, nothing is lost).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert.deps import torch_dtype
from ptconvert.errors import VerificationError
from ptconvert.formats import FORMATS_BY_NAME
from ptconvert.formats.byte_copy import tensor_bytes
from ptconvert.formats.reference import CHUNK, Ref, Reference
from ptconvert.formats.weightset import ByteRange, WeightEntry, WeightSet
from ptconvert.report import Report
from ptconvert.verify.same_bytes import WINDOW, Pair, Unmappable, first_differences
from ptconvert.weights.read import read_weights


@dataclass
class WeightsCheck(Report):
    status: str  # "pass" | "fail" | "skipped"
    tensors: int = 0
    bytes_compared: int = 0
    aliases: int = 0
    problems: list[str] = field(default_factory=list)
    reader: str = ""  # the independent reader of the source
    reader_seconds: float = 0.0  # its share: loading the source and producing its bytes
    seconds: float = 0.0  # the whole check


def verify_weights(
    source: WeightSet,
    output: Path,
    *,
    scans: list[Any] | None = None,
    trust: bool = False,
    load_timeout: float | None = None,
    cast_to: str | None = None,
) -> WeightsCheck:
    """Read ``output`` back and compare it with an independent reading of ``source``'s file.

    ``scans`` are the security scans of the source (``ptconvert.scan.guard``), and ``trust``
    the user's word: a program's own loader (TorchScript, pt2) runs only on a scan-clean file or
    with ``trust``; without ``scans`` the program is scanned here first. A TorchScript archive
    whose code runs at load is loaded in a child first, stopped after ``load_timeout`` seconds
    (``--load-timeout``; None: its default). Pickle checkpoints are
    never unpickled with code execution, whatever ``trust`` says. ``cast_to`` (``--dtype``): the
    source's floating tensors, as the reference reads them, cast to it before they are compared.
    VerificationError on any difference, or when no independent reader can read the source.
    """
    started = time.perf_counter()
    if not _read_without_torch(source):  # torch reads both sides
        for dtype in sorted({e.dtype for e in source.stored}):
            torch_dtype(
                dtype,
                f"checking the {dtype} tensors",
                path=source.origin,
                instead="pass --no-verify to convert without the check",
            )
    back = read_weights(output, keep_prefix=True)
    out = _resolve(back)
    with ExitStack() as stack:
        ref = reference(source, scans, trust, stack, load_timeout)
        expected = {n: r for n, r in ref.tensors.items() if not _skipped(n, source.skipped)}
        if cast_to:
            expected = {n: cast_ref(r, cast_to) for n, r in expected.items()}
        problems = list(ref.problems)
        missing = sorted(set(expected) - set(out))
        extra = sorted(set(out) - set(expected))
        if missing:
            problems.append(f"missing in output: {missing[:10]}")
        if extra:
            problems.append(f"not in the source as {ref.reader} reads it: {extra[:10]}")
        total, spent = _compare(expected, out, problems)
        ref.seconds += spent
    if problems:
        raise VerificationError(
            "the output does not hold the same tensors as the source: " + "; ".join(problems[:5]),
            path=output,
        )
    aliases = sum(1 for e in back.entries if e.alias_of is not None)
    return WeightsCheck(
        "pass",
        len(expected),
        total,
        aliases,
        reader=ref.reader,
        reader_seconds=round(ref.seconds, 3),
        seconds=round(time.perf_counter() - started, 3),
    )


def cast_ref(ref: Ref, to: str) -> Ref:
    """The reference reader's tensor cast to ``to`` by torch when ``--dtype`` casts it (its
    bytes gathered, cast, given back in chunks); any other as it is."""
    from ptconvert.weights.cast import ITEM_BYTES, casts

    if not casts(ref.dtype, to):
        return ref

    def chunks() -> Iterator[memoryview]:
        import torch

        raw = bytearray()
        for chunk in ref.chunks():
            raw += chunk
        source = torch_dtype(ref.dtype, "checking the cast weights")
        flat = torch.frombuffer(raw, dtype=source) if raw else torch.empty(0, dtype=source)
        data = tensor_bytes(flat.to(torch_dtype(to, "checking the cast weights")))
        for at in range(0, len(data), CHUNK):
            yield data[at : at + CHUNK]

    return Ref(to, ref.shape, math.prod(ref.shape) * ITEM_BYTES[to], chunks)


def _read_without_torch(ws: WeightSet) -> bool:
    """Whether the source's independent reader builds no tensor (pickle records, safetensors'
    header and bytes), so that any dtype can be compared without torch knowing it."""
    fmt = FORMATS_BY_NAME.get(ws.format)
    return fmt is not None and fmt.reference_without_torch


def reference(
    ws: WeightSet,
    scans: list[Any] | None,
    trust: bool,
    stack: ExitStack,
    load_timeout: float | None = None,
) -> Reference:
    """The source read by its format's independent reader, with the declared prefix strip."""
    if ws.origin is None:
        raise VerificationError("the source of these weights is not a file: nothing to compare")
    tick = time.perf_counter()
    ref = FORMATS_BY_NAME[ws.format].reference(
        ws, lambda: _may_load(ws, scans, trust, load_timeout), stack
    )
    ref.seconds += time.perf_counter() - tick
    if ws.stripped_prefix:
        cut = len(ws.stripped_prefix)
        wrong = [n for n in ref.tensors if not n.startswith(ws.stripped_prefix)]
        if wrong:
            ref.problems.append(f"names without the stripped prefix: {wrong[:5]}")
        ref.tensors = {n[cut:]: r for n, r in ref.tensors.items()}
    return ref


def _may_load(
    ws: WeightSet, scans: list[Any] | None, trust: bool, load_timeout: float | None = None
) -> bool:
    """Whether a program's own loader may run on the source: the scan found it clean, or
    ``trust``. A TorchScript archive it may run on is first loaded in a child, within
    ``load_timeout`` (``LoadTimeoutError`` if not: its ``__setstate__`` runs at load)."""
    if scans is None:
        from ptconvert.scan.guard import guard

        assert ws.origin is not None
        scans = guard(ws.origin, trust=trust)  # a shard index: with its shards
    may = trust or all(getattr(r, "verdict", "") == "clean" for r in scans)
    if may and ws.format:
        from ptconvert.formats import FORMATS_BY_NAME

        assert ws.origin is not None
        FORMATS_BY_NAME[ws.format].load_in_time(ws.origin, load_timeout)
    return may


def _skipped(name: str, skipped: dict[str, str]) -> bool:
    """Whether ``name`` was left out on purpose: it, or an entry it lies under, is skipped
    (a skipped object's tensors are named below it by a reader that sees into it)."""
    parts = name.split(".")
    return any(".".join(parts[:i]) in skipped for i in range(1, len(parts) + 1))


def _resolve(ws: WeightSet) -> dict[str, WeightEntry]:
    by_name = {e.name: e for e in ws.entries}
    return {e.name: by_name[e.alias_of] if e.alias_of is not None else e for e in ws.entries}


def _compare(
    expected: dict[str, Ref], out: dict[str, WeightEntry], problems: list[str]
) -> tuple[int, float]:
    """Compare every common tensor; return the bytes compared and the reference reader's time."""
    fds: dict[Path, int] = {}
    buf = bytearray(CHUNK)
    total, spent = 0, 0.0
    names = sorted(set(expected) & set(out))
    in_place = _in_place(names, expected, out)
    try:
        for name in names:
            a, b = expected[name], out[name]
            if (a.dtype, tuple(a.shape)) != (b.dtype, tuple(b.shape)):
                problems.append(f"{name}: {a.dtype}{list(a.shape)} became {b.dtype}{list(b.shape)}")
                continue
            if a.nbytes != b.nbytes:
                problems.append(f"{name}: {a.nbytes} bytes became {b.nbytes}")
                continue
            at = in_place.get(name)
            if name in in_place and not isinstance(at, Unmappable):
                if at is not None:
                    end = min(at + WINDOW, a.nbytes)
                    problems.append(f"{name}: bytes differ within [{at}, {end})")
                total += a.nbytes
                continue
            reader = _output_reader(b, fds)
            pos, same = 0, True
            chunks = a.chunks()
            while True:
                tick = time.perf_counter()
                chunk = next(chunks, None)
                spent += time.perf_counter() - tick
                if chunk is None:
                    break
                n = len(chunk)
                if pos + n > b.nbytes or not _same(reader, pos, chunk, buf):
                    problems.append(f"{name}: bytes differ within [{pos}, {pos + n})")
                    same = False
                    break
                pos += n
            if same and pos != a.nbytes:
                problems.append(f"{name}: the source reader gave {pos} of {a.nbytes} bytes")
            total += pos
    finally:
        for fd in fds.values():
            os.close(fd)
    return total, spent


def _in_place(
    names: list[str], expected: dict[str, Ref], out: dict[str, WeightEntry]
) -> dict[str, int | Unmappable | None]:
    """The tensors both files store as they are, of the same dtype, shape and size, compared in
    place (``same_bytes.first_differences``: threads side by side); one that cannot be mapped
    here is ``Unmappable`` (then it is compared in chunks)."""
    both = [
        n
        for n in names
        if expected[n].span is not None
        and out[n].source is not None
        and (expected[n].dtype, tuple(expected[n].shape), expected[n].nbytes)
        == (out[n].dtype, tuple(out[n].shape), out[n].nbytes)
    ]
    pairs: list[Pair] = []
    for n in both:
        a, b = expected[n], out[n]
        assert a.span is not None and b.source is not None
        pairs.append((a.span, (b.source.path, b.source.offset), a.nbytes))
    return dict(zip(both, first_differences(pairs), strict=True)) if pairs else {}


def _output_reader(entry: WeightEntry, fds: dict[Path, int]) -> Callable[[int, memoryview], int]:
    """A function filling a buffer with the output tensor's bytes from a position on."""
    if entry.source is None:
        data = tensor_bytes(entry.tensor).cast("B")

        def from_tensor(pos: int, into: memoryview) -> int:
            n = min(len(into), len(data) - pos)
            into[:n] = data[pos : pos + n]
            return n

        return from_tensor
    src: ByteRange = entry.source
    if src.path not in fds:
        fds[src.path] = os.open(src.path, os.O_RDONLY)
    fd = fds[src.path]

    def from_file(pos: int, into: memoryview) -> int:
        return os.preadv(fd, [into], src.offset + pos)

    return from_file


def _same(
    read: Callable[[int, memoryview], int], pos: int, chunk: memoryview, buf: bytearray
) -> bool:
    n = len(chunk)
    if read(pos, memoryview(buf)[:n]) != n:
        return False
    # bytearray == buffer runs memcmp; a slice copies, so whole buffers are compared as they are
    return buf == chunk if n == len(buf) else buf[:n] == chunk
