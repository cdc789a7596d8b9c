"""Bitwise verification of a weights conversion against an independent reading of the source.

The output is read back with ptconvert's own reader; the source is read again by another
implementation, its format's ``reference`` (pickle checkpoints: stdlib ``pickle`` and ``zipfile``
through ``pickles/stdlib_checkpoint.py``, which imports and calls nothing a pickle names, with or
without ``--trust``; ``safe_open`` for safetensors; the program's own loader after a clean scan;
the onnx package for ONNX), so that a blind spot of ptconvert's symbolic reader, a tensor it cannot
see, cannot pass its own check. Names (after the declared
unwrap, prefix strip and aliases), dtypes, shapes and bytes must agree; tensors left out on purpose
(``--skip-unsupported``) are excluded by name, with whatever lies under that name.

Tensors the writer copies from the source file are compared while it goes on
(``CompareAhead``): a thread reads the source with the reference reader and compares each range
``byte_copy.copy_range`` reports as written, on the core the kernel's copy leaves free. The check
after the write takes such a comparison only for a tensor that ptconvert's reader of the finished
output places exactly there (the same file, offset and length, against the same place of the
source); any other is compared then.

Memory stays flat whatever the size. A tensor that both files store as it is (the reference
reader gives its place in the source, ptconvert's reader its place in the output) is compared in
place, a window of both files mapped at a time and compared with ``memcmp``
(``verify/same_bytes.py``: half the time of reading both into buffers). Any other is compared in
chunks: the output read with ``pread``, and the pages of the source that a reference reader maps
into the process dropped from it once compared (``madvise(MADV_DONTNEED)`` on that file's
read-only mappings: they are read again from the page cache when touched, nothing is lost).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
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
from ptconvert.verify.same_bytes import WINDOW, Unmappable, first_difference
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


# bytes compared while the output was written: (the source's file and offset, the output's
# (st_dev, st_ino) and offset, the length) → where they first differ, None when equal
Compared = dict[tuple[tuple[Path, int], tuple[int, int], int, int], int | None]


class CompareAhead:
    """The source's tensors compared with the output's while the writer writes them: started
    before the write (``byte_copy.reporting_copies(ahead.written)`` around it), ``finish``
    after it, whose ``Compared`` ``verify_weights`` takes. Only for sources whose reference
    reader builds no tensor (``reference_without_torch``): torch's import would hold the GIL the
    copy leaves free. Anything this thread cannot do is left to the check after the write."""

    def __init__(self, source: WeightSet, scans: list[Any] | None, trust: bool) -> None:
        self._source, self._scans, self._trust = source, scans, trust
        # (tensor name, the output file, its (st_dev, st_ino), offset, bytes); None ends
        self._todo: queue.Queue[tuple[str, int, tuple[int, int], int, int] | None]
        self._todo = queue.Queue()
        self._files: dict[tuple[int, int], int] = {}  # one dup of each output file's fd
        self._compared: Compared = {}
        self._cancelled = False
        self._thread = threading.Thread(target=self._run, name="ptconvert-compare", daemon=True)
        self._thread.start()

    @staticmethod
    def applies(source: WeightSet) -> bool:
        return source.origin is not None and _read_without_torch(source)

    def written(self, name: str, fd: int, offset: int, nbytes: int) -> None:
        """``byte_copy``'s listener: ``name``'s bytes now lie at ``offset`` of ``fd`` (a tensor
        it cannot take is left to the check after the write)."""
        try:
            st = os.fstat(fd)
            file = (st.st_dev, st.st_ino)
            if file not in self._files:
                self._files[file] = os.dup(fd)  # the writer closes its own when done
        except OSError:
            return
        self._todo.put((name, self._files[file], file, offset, nbytes))

    def finish(self, *, cancel: bool = False) -> Compared:
        """Wait for the comparisons still queued (``cancel``: drop them, the write failed)."""
        self._cancelled = cancel
        self._todo.put(None)
        try:
            self._thread.join()
        finally:
            for fd in self._files.values():
                os.close(fd)
            self._files.clear()
        return self._compared

    def _run(self) -> None:
        with ExitStack() as stack:
            try:
                tensors = reference(self._source, self._scans, self._trust, stack).tensors
            except Exception:  # the check after the write reads it again and says why
                tensors = {}
            while (item := self._todo.get()) is not None:
                name, fd, file, offset, nbytes = item
                ref = tensors.get(name)
                if self._cancelled or ref is None or ref.span is None or ref.nbytes != nbytes:
                    continue
                try:
                    at = first_difference(ref.span, (fd, offset), nbytes)
                except Exception:  # unmappable here, or anything else: compared after the write
                    continue
                self._compared[(ref.span, file, offset, nbytes)] = at


def verify_weights(
    source: WeightSet,
    output: Path,
    *,
    scans: list[Any] | None = None,
    trust: bool = False,
    compared: Compared | None = None,
) -> WeightsCheck:
    """Read ``output`` back and compare it with an independent reading of ``source``'s file.

    ``scans`` are the security scans of the source (``ptconvert.scan.guard``), and ``trust``
    the user's word: a program's own loader (TorchScript, pt2) runs only on a scan-clean file or
    with ``trust``; without ``scans`` the program is scanned here first. Pickle checkpoints are
    never unpickled with code execution, whatever ``trust`` says.
    ``compared``: what ``CompareAhead`` compared while the output was written.
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
        ref = reference(source, scans, trust, stack)
        expected = {n: r for n, r in ref.tensors.items() if not _skipped(n, source.skipped)}
        problems = list(ref.problems)
        missing = sorted(set(expected) - set(out))
        extra = sorted(set(out) - set(expected))
        if missing:
            problems.append(f"missing in output: {missing[:10]}")
        if extra:
            problems.append(f"not in the source as {ref.reader} reads it: {extra[:10]}")
        total, spent = _compare(expected, out, problems, compared or {})
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


def _read_without_torch(ws: WeightSet) -> bool:
    """Whether the source's independent reader builds no tensor (pickle records, safetensors'
    header and bytes), so that any dtype can be compared without torch knowing it."""
    fmt = FORMATS_BY_NAME.get(ws.format)
    return fmt is not None and fmt.reference_without_torch


def reference(ws: WeightSet, scans: list[Any] | None, trust: bool, stack: ExitStack) -> Reference:
    """The source read by its format's independent reader, with the declared prefix strip."""
    if ws.origin is None:
        raise VerificationError("the source of these weights is not a file: nothing to compare")
    tick = time.perf_counter()
    ref = FORMATS_BY_NAME[ws.format].reference(ws, lambda: _may_load(ws, scans, trust), stack)
    ref.seconds += time.perf_counter() - tick
    if ws.stripped_prefix:
        cut = len(ws.stripped_prefix)
        wrong = [n for n in ref.tensors if not n.startswith(ws.stripped_prefix)]
        if wrong:
            ref.problems.append(f"names without the stripped prefix: {wrong[:5]}")
        ref.tensors = {n[cut:]: r for n, r in ref.tensors.items()}
    return ref


def _may_load(ws: WeightSet, scans: list[Any] | None, trust: bool) -> bool:
    """Whether a program's own loader may run on the source: the scan found it clean, or
    ``trust``."""
    if scans is None:
        from ptconvert.scan.guard import guard

        assert ws.origin is not None
        scans = guard(ws.origin, trust=trust)  # a shard index: with its shards
    return trust or all(getattr(r, "verdict", "") == "clean" for r in scans)


def _skipped(name: str, skipped: dict[str, str]) -> bool:
    """Whether ``name`` was left out on purpose: it, or an entry it lies under, is skipped
    (a skipped object's tensors are named below it by a reader that sees into it)."""
    parts = name.split(".")
    return any(".".join(parts[:i]) in skipped for i in range(1, len(parts) + 1))


def _resolve(ws: WeightSet) -> dict[str, WeightEntry]:
    by_name = {e.name: e for e in ws.entries}
    return {e.name: by_name[e.alias_of] if e.alias_of is not None else e for e in ws.entries}


def _compare(
    expected: dict[str, Ref], out: dict[str, WeightEntry], problems: list[str], compared: Compared
) -> tuple[int, float]:
    """Compare every common tensor (or take what was compared where the output holds it); return
    the bytes compared and the reference reader's time."""
    fds: dict[Path, int] = {}
    same_in_place = _in_place(compared)
    buf = bytearray(CHUNK)
    total, spent = 0, 0.0
    try:
        for name in sorted(set(expected) & set(out)):
            a, b = expected[name], out[name]
            if (a.dtype, tuple(a.shape)) != (b.dtype, tuple(b.shape)):
                problems.append(f"{name}: {a.dtype}{list(a.shape)} became {b.dtype}{list(b.shape)}")
                continue
            if a.nbytes != b.nbytes:
                problems.append(f"{name}: {a.nbytes} bytes became {b.nbytes}")
                continue
            if a.span is not None and b.source is not None and same_in_place(name, a, b, problems):
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


def _in_place(compared: Compared) -> Callable[[str, Ref, WeightEntry, list[str]], bool]:
    files: dict[Path, tuple[int, int]] = {}

    def same_in_place(name: str, a: Ref, b: WeightEntry, problems: list[str]) -> bool:
        """Compare two tensors stored as they are in files in place (``same_bytes``), or take
        the comparison of those very ranges made while the output was written: True once
        compared (a difference said in ``problems``), False when they cannot be mapped here
        (then they are compared in chunks)."""
        assert a.span is not None and b.source is not None
        try:
            path = b.source.path
            if compared and path not in files:
                st = os.stat(path)
                files[path] = (st.st_dev, st.st_ino)
            key = (a.span, files.get(path, (-1, -1)), b.source.offset, a.nbytes)
            if key in compared:
                at = compared[key]
            else:
                at = first_difference(a.span, (path, b.source.offset), a.nbytes)
        except (Unmappable, OSError):
            return False
        if at is not None:
            problems.append(f"{name}: bytes differ within [{at}, {min(at + WINDOW, a.nbytes)})")
        return True

    return same_in_place


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
