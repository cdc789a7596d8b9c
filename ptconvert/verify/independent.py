"""The independent readings of a weights source that verify/weights.py compares an output with:
another implementation than weights/read.py's readers, so that a blind spot of ptconvert's own
reader cannot pass its own check. Pickle checkpoints are read as records (stdlib ``pickle`` and
``zipfile``: nothing a pickle names is imported or called, with or without ``--trust``);
safetensors by ``safe_open`` and the header's offsets; TorchScript and pt2 by their own loader
after a clean scan; ONNX by the onnx package. Each yields its tensors' bytes in chunks, and the
pages a loader maps are dropped from this process once compared."""

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

from ptconvert.errors import VerificationError
from ptconvert.formats.safetensors import DTYPES as SAFETENSORS_DTYPES
from ptconvert.formats.torch_objects import flatten_tensors
from ptconvert.weights.read import (
    ALIASES_KEY,
    WeightSet,
)

if TYPE_CHECKING:
    from ptconvert.verify.pickle_files import PickleFile
    from ptconvert.verify.pickle_records import Tensor

CHUNK = 2 << 20
DROP_EVERY = CHUNK  # bytes read through a loader's mapping between two page drops


@dataclass
class Ref:
    """A tensor as the independent reader sees it; ``chunks`` yields its bytes in order."""

    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    chunks: Callable[[], Iterator[memoryview]]


@dataclass
class Reference:
    reader: str
    tensors: dict[str, Ref]
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0


def reference(ws: WeightSet, scans: list[Any] | None, trust: bool, stack: ExitStack) -> Reference:
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


def _apply_renames(ws: WeightSet, ref: Reference) -> None:
    """The declared prefix strip, then the declared aliases of a safetensors source."""
    if ws.stripped_prefix:
        cut = len(ws.stripped_prefix)
        wrong = [n for n in ref.tensors if not n.startswith(ws.stripped_prefix)]
        if wrong:
            ref.problems.append(f"names without the stripped prefix: {wrong[:5]}")
        ref.tensors = {n[cut:]: r for n, r in ref.tensors.items()}


def _torch_reference(ws: WeightSet, paths: list[Path]) -> Reference:
    """Pickle checkpoints read as records (``pickle_files``): stdlib pickle, zipfile and tarfile,
    nothing the pickle names imported or called, no torch."""
    from ptconvert.verify.pickle_files import read_pickle_file
    from ptconvert.verify.pickle_records import Tensor

    def is_record(value: Any) -> bool:
        return isinstance(value, Tensor)

    tensors: dict[str, Ref] = {}
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
    return Reference(" + ".join(sorted(readers)), tensors, problems)


def _record_ref(read: PickleFile, t: Tensor, pages: _Pages) -> Ref:
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

    return Ref(t.dtype, t.shape, t.nbytes, chunks)


def _program_reference(ws: WeightSet, may_load: bool) -> Reference:
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
    return Reference(f"{reader} after a clean scan", tensors, [])


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


def _onnx_reference(path: Path) -> Reference:
    """The onnx package's own reader (``onnx.load`` with external data, ``numpy_helper``):
    another implementation than the onnx_ir reader the conversion used."""
    import numpy as np
    import onnx
    import torch
    from onnx import numpy_helper

    from ptconvert.formats.onnx import ONNX_DTYPES

    model = onnx.load(str(path), load_external_data=True)
    tensors: dict[str, Ref] = {}
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
    return Reference("onnx.load + numpy_helper", tensors)


def _torch_ref(t: Any, pages: _Pages | None) -> Ref:
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


def _safetensors_reference(paths: list[Path], stack: ExitStack) -> Reference:
    """safetensors' own ``safe_open`` validates each file and names every tensor's dtype and
    shape; the bytes are read at the offsets of the file's header, parsed here (not by
    ``weights/read.py``), and must agree with what ``safe_open`` says. No tensor is built: no
    ml_dtypes, no torch (importing them costs more than comparing a GiB)."""
    from safetensors import safe_open

    tensors: dict[str, Ref] = {}
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
            tensors[name] = Ref(dtype, shape, nbytes, _file_range(fd, data_start + begin, nbytes))
        aliases = json.loads(metadata.get(ALIASES_KEY, "{}"))
        for alias, target in aliases.items():
            if target in tensors:
                tensors[alias] = tensors[target]
    return Reference("safetensors.safe_open + the header's offsets", tensors, problems)


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
