"""Bitwise verification of a weights conversion against an independent reading of the source.

The output is read back with ptconvert's own reader; the source is read again by another
implementation (pickle checkpoints: stdlib ``pickle`` and ``zipfile`` through ``pickle_files``,
which imports and calls nothing a pickle names, with or without ``--trust``; ``safe_open`` for
safetensors; the program's own loader after a clean scan), so that a blind spot of ptconvert's
symbolic reader, a tensor it cannot see, cannot pass its own check. Names (after the declared
unwrap, prefix strip and aliases), dtypes, shapes and bytes must agree; tensors left out on purpose
(``--skip-unsupported``) are excluded by name, with whatever lies under that name.

Memory stays flat whatever the size: bytes are compared in chunks, the output is read with
``pread``, and the pages of the source that a reference reader maps into the process are dropped
from it once compared (``madvise(MADV_DONTNEED)`` on that file's read-only mappings: they are read
again from the page cache when touched, nothing is lost).
"""

from __future__ import annotations

import ctypes
import itertools
import json
import math
import mmap
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ptconvert.deps import torch_dtype
from ptconvert.errors import VerificationError
from ptconvert.formats.safetensors import DTYPES as SAFETENSORS_DTYPES
from ptconvert.formats.torch_objects import flatten_tensors
from ptconvert.report import Report
from ptconvert.weights.read import (
    ALIASES_KEY,
    ByteRange,
    WeightEntry,
    WeightSet,
    read_weights,
)
from ptconvert.weights.write import tensor_bytes

if TYPE_CHECKING:
    from ptconvert.verify.pickle_files import PickleFile
    from ptconvert.verify.pickle_records import Tensor

CHUNK = 2 << 20
DROP_EVERY = CHUNK  # bytes read through a loader's mapping between two page drops


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


@dataclass
class _Ref:
    """A tensor as the independent reader sees it; ``chunks`` yields its bytes in order."""

    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    chunks: Callable[[], Iterator[memoryview]]


@dataclass
class _Reference:
    reader: str
    tensors: dict[str, _Ref]
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0


def verify_weights(
    source: WeightSet,
    output: Path,
    *,
    scans: list[Any] | None = None,
    trust: bool = False,
) -> WeightsCheck:
    """Read ``output`` back and compare it with an independent reading of ``source``'s file.

    ``scans`` are the security scans of the source (``ptconvert.scan.guard``), and ``trust``
    the user's word: a program's own loader (TorchScript, pt2) runs only on a scan-clean file or
    with ``trust``; without ``scans`` the program is scanned here first. Pickle checkpoints are
    never unpickled with code execution, whatever ``trust`` says.
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
        ref = _reference(source, scans, trust, stack)
        expected = {n: r for n, r in ref.tensors.items() if not _skipped(n, source.skipped)}
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


def _read_without_torch(ws: WeightSet) -> bool:
    """Whether the source's independent reader builds no tensor (pickle records, safetensors'
    header and bytes), so that any dtype can be compared without torch knowing it."""
    return ws.format in ("pt", "safetensors", "sharded")


def _skipped(name: str, skipped: dict[str, str]) -> bool:
    """Whether ``name`` was left out on purpose: it, or an entry it lies under, is skipped
    (a skipped object's tensors are named below it by a reader that sees into it)."""
    parts = name.split(".")
    return any(".".join(parts[:i]) in skipped for i in range(1, len(parts) + 1))


def _resolve(ws: WeightSet) -> dict[str, WeightEntry]:
    by_name = {e.name: e for e in ws.entries}
    return {e.name: by_name[e.alias_of] if e.alias_of is not None else e for e in ws.entries}


def _compare(
    expected: dict[str, _Ref], out: dict[str, WeightEntry], problems: list[str]
) -> tuple[int, float]:
    """Compare every common tensor; return the bytes compared and the reference reader's time."""
    fds: dict[Path, int] = {}
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


# --- the independent readers --------------------------------------------------------------


def _reference(ws: WeightSet, scans: list[Any] | None, trust: bool, stack: ExitStack) -> _Reference:
    if ws.origin is None:
        raise VerificationError("the source of these weights is not a file: nothing to compare")
    tick = time.perf_counter()
    reader = INDEPENDENT_READERS.get(ws.format)
    if reader is None:
        raise VerificationError(f"no independent reader for {ws.format} sources", path=ws.origin)
    ref = reader(ws, lambda: _may_load(ws, scans, trust), stack)
    ref.seconds += time.perf_counter() - tick
    _apply_renames(ws, ref)
    return ref


def _sharded_reference(ws: WeightSet, may_load: Callable[[], bool], stack: ExitStack) -> Any:
    from ptconvert.formats.sharded import read_index

    assert ws.origin is not None
    shards = sorted(set(read_index(ws.origin)["weight_map"].values()))
    paths = [ws.origin.parent / s for s in shards]
    if ws.layout == "safetensors":
        return _safetensors_reference(paths, stack)
    return _torch_reference(ws, paths)


def _may_load(ws: WeightSet, scans: list[Any] | None, trust: bool) -> bool:
    """Whether a program's own loader may run on the source: the scan found it clean, or
    ``trust``."""
    if scans is None:
        from ptconvert.scan.guard import guard

        assert ws.origin is not None
        scans = guard(ws.origin.parent if ws.format == "sharded" else ws.origin, trust=trust)
    return trust or all(getattr(r, "verdict", "") == "clean" for r in scans)


def _apply_renames(ws: WeightSet, ref: _Reference) -> None:
    """The declared prefix strip, then the declared aliases of a safetensors source."""
    if ws.stripped_prefix:
        cut = len(ws.stripped_prefix)
        wrong = [n for n in ref.tensors if not n.startswith(ws.stripped_prefix)]
        if wrong:
            ref.problems.append(f"names without the stripped prefix: {wrong[:5]}")
        ref.tensors = {n[cut:]: r for n, r in ref.tensors.items()}


def _torch_reference(ws: WeightSet, paths: list[Path]) -> _Reference:
    """Pickle checkpoints read as records (``pickle_files``): stdlib pickle, zipfile and tarfile,
    nothing the pickle names imported or called, no torch."""
    from ptconvert.verify.pickle_files import read_pickle_file
    from ptconvert.verify.pickle_records import Tensor

    def is_record(value: Any) -> bool:
        return isinstance(value, Tensor)

    tensors: dict[str, _Ref] = {}
    problems: list[str] = []
    readers: set[str] = set()
    for path in paths:
        try:
            read = read_pickle_file(path)
        except Exception as exc:  # the unpickler raises UnpicklingError, ValueError, KeyError…
            raise VerificationError(
                "no independent reader can read the source, so the output cannot be checked: "
                f"{type(exc).__name__}: {str(exc)[:300]}",
                path=path,
                hint="pass --no-verify to convert without the check",
            ) from None
        reader = f"pickle records ({read.reader})"
        readers.add(reader)
        tree = _plain(read.tree, problems, is_tensor=is_record)
        if ws.unwrapped is not None and len(paths) == 1:
            if not isinstance(tree, dict) or ws.unwrapped not in tree:
                problems.append(f"{reader} finds no {ws.unwrapped!r} entry to unwrap")
                continue
            tree = tree[ws.unwrapped]
        collisions: list[str] = []
        flat = flatten_tensors(tree, is_tensor=is_record, collisions=collisions)
        if collisions:
            problems.append(f"names that two tensors flatten to: {collisions[:5]}")
        pages = _Pages(path)
        for name, t in flat.items():
            problem = read.problem(t)
            if problem is not None:
                problems.append(f"{name}: {problem}")
            else:
                tensors[name] = _record_ref(read, t, pages)
    return _Reference(" + ".join(sorted(readers)), tensors, problems)


def _record_ref(read: PickleFile, t: Tensor, pages: _Pages) -> _Ref:
    """A tensor record's bytes as torch.load gives them: C order, little-endian."""
    size = t.itemsize
    # elements of a big-endian storage are swapped, complex numbers half by half, as torch does
    unit = size // 2 if t.dtype.startswith("complex") else size
    swap = read.big_endian and unit > 1

    def pieces() -> Iterator[memoryview]:
        data = read.storage_bytes(t.storage)
        if t.contiguous:
            start = t.offset * size
            for pos in range(0, t.nbytes, CHUNK):
                yield data[start + pos : start + min(pos + CHUNK, t.nbytes)]
            return
        import numpy as np

        # the view's elements as rows of bytes, gathered a block of rows at a time
        base = np.frombuffer(data, dtype=np.uint8)[t.offset * size :]
        rows = np.lib.stride_tricks.as_strided(
            base, (*t.shape, size), (*(s * size for s in t.stride), 1), writeable=False
        )
        for index in _blocks(t.shape, size):
            yield np.ascontiguousarray(rows[index]).data.cast("B")

    def chunks() -> Iterator[memoryview]:
        if t.nbytes == 0:
            return
        read_since = 0
        for piece in pieces():
            if swap:
                import numpy as np

                piece = np.frombuffer(piece, dtype=f"u{unit}").byteswap().data.cast("B")
            yield piece
            read_since += len(piece)
            if read_since >= DROP_EVERY:
                pages.drop()
                read_since = 0
        pages.drop()

    return _Ref(t.dtype, t.shape, t.nbytes, chunks)


def _program_reference(ws: WeightSet, may_load: bool) -> _Reference:
    """The program's own loader (torch.jit.load, torch.export.load) and its state dict, run
    only after a clean scan."""
    assert ws.origin is not None
    if not may_load:
        raise VerificationError(
            "the program is not scan-clean, so it is not loaded to check its weights",
            path=ws.origin,
            hint="pass --no-verify to convert without the check",
        )
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if ws.format == "pt2":
            from ptconvert.formats.pt2 import load_exported

            state = dict(load_exported(ws.origin).state_dict)
            reader = "torch.export.load(...).state_dict"
        else:
            state = torch.jit.load(str(ws.origin), map_location="cpu").state_dict()
            reader = "torch.jit.load(...).state_dict()"
    tensors = {n: _torch_ref(t.detach(), None) for n, t in state.items()}
    return _Reference(f"{reader} after a clean scan", tensors, [])


def _is_torch_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _plain(value: Any, problems: list[str], is_tensor: Callable[[Any], bool] | None = None) -> Any:
    """An unpickled tree as dicts, lists and tuples around tensors (``is_tensor``; torch's by
    default): an object becomes the dict of its attributes (as the symbolic reader reads
    objects), a set holding tensors is reported (its tensors have no names)."""
    tensor = is_tensor or _is_torch_tensor
    memo: dict[int, Any] = {}

    def walk(v: Any) -> Any:
        if tensor(v) or v is None or isinstance(v, (str, bytes, int, float)):
            return v
        if id(v) in memo:
            return memo[id(v)]
        if isinstance(v, dict):
            out: Any = {}
            memo[id(v)] = out
            for k, x in v.items():
                out[k] = walk(x)
            return out
        if isinstance(v, list):
            out = []
            memo[id(v)] = out
            out.extend(walk(x) for x in v)
            return out
        if isinstance(v, tuple):
            return tuple(walk(x) for x in v)
        if isinstance(v, (set, frozenset)):
            n = sum(1 for x in v if tensor(x))
            if n:
                problems.append(f"{n} tensors in a set, which has no names for them")
            return None
        attrs = getattr(v, "__dict__", None)
        if isinstance(attrs, dict) and not isinstance(v, type):
            return walk(attrs)
        return v

    return walk(value)


def _onnx_reference(path: Path) -> _Reference:
    """The onnx package's own reader (``onnx.load`` with external data, ``numpy_helper``):
    another implementation than the onnx_ir reader the conversion used."""
    import numpy as np
    import onnx
    import torch
    from onnx import numpy_helper

    from ptconvert.formats.onnx import ONNX_DTYPES

    model = onnx.load(str(path), load_external_data=True)
    tensors: dict[str, _Ref] = {}
    for init in model.graph.initializer:
        array = np.ascontiguousarray(numpy_helper.to_array(init))
        dtype = getattr(torch, ONNX_DTYPES.get(init.data_type, ""), None)
        if dtype is None:
            continue
        if array.dtype.kind not in "biufc":  # bfloat16, float8 (ml_dtypes): by their bits
            t = torch.from_numpy(array.view(f"u{array.dtype.itemsize}")).view(dtype)
        else:
            t = torch.from_numpy(array)
        tensors[init.name] = _torch_ref(t, None)
    return _Reference("onnx.load + numpy_helper", tensors)


def _torch_ref(t: Any, pages: _Pages | None) -> _Ref:
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

    return _Ref(dtype, tuple(t.shape), nbytes, chunks)


def _safetensors_reference(paths: list[Path], stack: ExitStack) -> _Reference:
    """safetensors' own ``safe_open`` validates each file and names every tensor's dtype and
    shape; the bytes are read at the offsets of the file's header, parsed here (not by
    ``weights/read.py``), and must agree with what ``safe_open`` says. No tensor is built: no
    ml_dtypes, no torch (importing them costs more than comparing a GiB)."""
    from safetensors import safe_open

    tensors: dict[str, _Ref] = {}
    problems: list[str] = []
    for path in paths:
        with safe_open(path, "numpy") as f:  # raises on a header safetensors refuses
            slices = {n: f.get_slice(n) for n in f.keys()}  # noqa: SIM118 (not a mapping)
            declared = {n: (v.get_dtype(), tuple(v.get_shape())) for n, v in slices.items()}
            metadata = f.metadata() or {}
        header, data_start = _header(path)
        fd = os.open(path, os.O_RDONLY)
        stack.callback(os.close, fd)
        for name, (code, shape) in declared.items():
            entry = header.get(name, {})
            if (entry.get("dtype"), tuple(entry.get("shape", ()))) != (code, shape):
                problems.append(f"{name}: the header and safe_open disagree")
                continue
            begin, stop = entry["data_offsets"]
            dtype, bits = SAFETENSORS_DTYPES.get(code, (code.lower(), 8))
            if dtype == "float4_e2m1fn_x2" and shape:
                shape = (*shape[:-1], shape[-1] // 2)
            nbytes = (math.prod(shape) * bits + 7) // 8
            if stop - begin != nbytes:
                problems.append(f"{name}: {stop - begin} bytes stored for {nbytes}")
                continue
            tensors[name] = _Ref(dtype, shape, nbytes, _file_range(fd, data_start + begin, nbytes))
        aliases = json.loads(metadata.get(ALIASES_KEY, "{}"))
        for alias, target in aliases.items():
            if target in tensors:
                tensors[alias] = tensors[target]
    return _Reference("safetensors.safe_open + the header's offsets", tensors, problems)


def _header(path: Path) -> tuple[dict[str, Any], int]:
    """The safetensors header of ``path`` (8-byte little-endian length, then JSON) and where its
    data begins."""
    with open(path, "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(size))
    return header, 8 + size


def _file_range(fd: int, offset: int, nbytes: int) -> Callable[[], Iterator[memoryview]]:
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


def _blocks(shape: tuple[int, ...], itemsize: int) -> Iterator[tuple[Any, ...]]:
    """Index tuples cutting a C-order array into consecutive blocks of at most CHUNK bytes."""
    if not shape:
        yield ()
        return
    inner = itemsize
    axis = len(shape)
    while axis > 0 and inner * shape[axis - 1] <= CHUNK:
        axis -= 1
        inner *= shape[axis]
    if axis == 0:
        yield (slice(None),)
        return
    axis -= 1  # rows of ``inner`` bytes along this axis, ``step`` of them per block
    step = max(1, CHUNK // inner)
    for outer in itertools.product(*(range(n) for n in shape[:axis])):
        for i in range(0, shape[axis], step):
            yield (*outer, slice(i, min(i + step, shape[axis])))


class _Pages:
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


# The independent reader per source format: (the weight set read, whether a program's own
# loader may run on the source — the scan found it clean, or --trust —, an exit stack) → what
# it reads. Another implementation than weights/read.py's READERS, so a blind spot of ours
# cannot pass its check. Pickle checkpoints are never unpickled with code execution.
INDEPENDENT_READERS: dict[str, Callable[[WeightSet, Callable[[], bool], ExitStack], Any]] = {
    "safetensors": lambda ws, may, stack: _safetensors_reference([_origin(ws)], stack),
    "sharded": _sharded_reference,
    "pt": lambda ws, may, stack: _torch_reference(ws, [_origin(ws)]),
    "torchscript": lambda ws, may, stack: _program_reference(ws, may()),
    "pt2": lambda ws, may, stack: _program_reference(ws, may()),
    "onnx": lambda ws, may, stack: _onnx_reference(_origin(ws)),
}


def _origin(ws: WeightSet) -> Path:
    assert ws.origin is not None
    return ws.origin
