"""The independent reading of pickle checkpoints for the bitwise check: the standard library's
unpickler and zip/tar readers (``pickles/stdlib_checkpoint.py``), nothing a pickle names imported
or called, no torch; a tensor record's bytes as ``torch.load`` gives them (C order,
little-endian). Shares no code with ``checkpoint_weights.py``, the reading it checks."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ptconvert.errors import VerificationError
from ptconvert.formats.reference import CHUNK, DROP_EVERY, Pages, Ref, Reference
from ptconvert.formats.torch_objects import flatten_tensors
from ptconvert.formats.weightset import WeightSet
from ptconvert.pickles.records import MAX_NESTING
from ptconvert.pickles.stdlib_checkpoint import PickleFile, read_pickle_file
from ptconvert.pickles.stdlib_unpickler import Tensor


def pickle_reference(ws: WeightSet, paths: list[Path]) -> Reference:
    """Pickle checkpoints read as records: stdlib pickle, zipfile and tarfile, nothing the
    pickle names imported or called, no torch."""

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
        pages = Pages(path)
        for name, t in flat.items():
            problem = read.problem(t)
            if problem is not None:
                problems.append(f"{name}: {problem}")
            else:
                tensors[name] = _record_ref(read, t, pages, path)
    return Reference(" + ".join(sorted(readers)), tensors, problems)


def _record_ref(read: PickleFile, t: Tensor, pages: Pages, path: Path) -> Ref:
    """A tensor record's bytes as torch.load gives them: C order, little-endian (and where
    they lie in the file, when they lie there as they are)."""
    size = t.itemsize
    # elements of a big-endian storage are swapped, complex numbers half by half, as torch does
    unit = size // 2 if t.dtype.startswith("complex") else size
    swap = read.big_endian and unit > 1
    at = read.file_offset(t.storage)
    span = (path, at + t.offset * size) if at is not None and t.contiguous and not swap else None

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

    return Ref(t.dtype, t.shape, t.nbytes, chunks, span)


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


def _plain(value: Any, problems: list[str], is_tensor: Callable[[Any], bool]) -> Any:
    """An unpickled tree as dicts, lists and tuples around tensors (``is_tensor``; torch's by
    default): an object becomes the dict of its attributes (as the symbolic reader reads
    objects), a set holding tensors is reported (its tensors have no names). Each container is
    read once however often it is shared, and no deeper than the symbolic reader reads: past
    that depth (where that reader refuses the tensors it cannot reach) it is reported too."""
    tensor = is_tensor
    memo: dict[int, Any] = {}

    def walk(v: Any, depth: int = 0) -> Any:
        if tensor(v) or v is None or isinstance(v, (str, bytes, int, float)):
            return v
        if id(v) in memo:
            return memo[id(v)]
        if depth > MAX_NESTING:  # the walk recurses: bounded, and said once
            memo[id(v)] = None
            why = f"values nested deeper than {MAX_NESTING} levels are not read"
            if why not in problems:
                problems.append(why)
            return None
        if isinstance(v, dict):
            out: Any = {}
            memo[id(v)] = out
            for k, x in v.items():
                out[k] = walk(x, depth + 1)
            return out
        if isinstance(v, list):
            out = []
            memo[id(v)] = out
            out.extend(walk(x, depth + 1) for x in v)
            return out
        if isinstance(v, tuple):
            memo[id(v)] = out = tuple(walk(x, depth + 1) for x in v)
            return out
        if isinstance(v, (set, frozenset)):
            n = sum(1 for x in v if tensor(x))
            if n:
                problems.append(f"{n} tensors in a set, which has no names for them")
            return None
        attrs = getattr(v, "__dict__", None)
        if isinstance(attrs, dict) and not isinstance(v, type):
            return walk(attrs, depth + 1)
        return v

    return walk(value)
