"""Torch pickles read as records: nothing the pickle names is ever imported or called.

``RecordUnpickler`` is CPython's own unpickler (``pickle.Unpickler``) with a ``find_class`` that
never imports. Containers get the real harmless types (``dict``, ``list``, ``OrderedDict``, …);
torch's rebuild functions get functions of this module that make ``Tensor`` records (storage,
dtype, storage offset, shape, stride); storage classes and dtypes get ``StorageType`` and
``DType`` records; every other name gets a fresh ``StandIn`` class whose instances only record
what the pickle does to them. It is another implementation than ptconvert's symbolic pickle
machine (``pickles/machine.py``), so that a blind spot of that reader cannot pass its own check.
"""

from __future__ import annotations

import _compat_pickle
import collections
import copyreg
import math
import pickle
import reprlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# torch.<Name>Storage → dtype: the 17 legacy typed storages torch.load knows
# (torch.storage._dtype_to_storage_type_map), and the untyped byte storage
STORAGE_DTYPES: dict[str, str] = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "BFloat16Storage": "bfloat16",
    "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64",
    "QInt8Storage": "qint8",
    "QInt32Storage": "qint32",
    "QUInt8Storage": "quint8",
    "QUInt4x2Storage": "quint4x2",
    "QUInt2x4Storage": "quint2x4",
    "UntypedStorage": "uint8",
}

# every torch dtype name → bytes per element (torch.<name>.itemsize)
ITEMSIZES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "bool": 1,
    "complex128": 16,
    "complex64": 8,
    "complex32": 4,
    "bcomplex32": 4,
    "qint8": 1,
    "qint32": 4,
    "quint8": 1,
    "quint4x2": 1,
    "quint2x4": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,
    "bits1x8": 1,
    "bits2x4": 1,
    "bits4x2": 1,
    "bits8": 1,
    "bits16": 2,
    **{f"{sign}int{bits}": 1 for sign in ("", "u") for bits in range(1, 8)},
}

# ``_rebuild_from_type_v2`` types whose instances are plain tensors (Python attributes aside)
_PLAIN_TENSOR_TYPES = frozenset(
    {"torch.Tensor", "torch.nn.parameter.Parameter", "torch.nn.parameter.Buffer"}
)


_REPR = reprlib.Repr()
_REPR.maxlevel = 3


def brief(value: Any, limit: int) -> str:
    """``repr`` cut to ``limit`` characters, in bounded work: reprlib's few levels and items (a
    pickled tuple may hold another twice, 40 deep: its ``repr`` never ends)."""
    try:
        return _REPR.repr(value)[:limit]
    except Exception:  # reprlib picks a method by type name: a stand-in may be named "tuple"
        return f"<{type(value).__name__}>"


def _no_build(self: Any, state: Any) -> None:
    """A BUILD on a record (torch would call the tensor's ``set_`` or an instance
    ``__setstate__`` with the pickle's arguments): no checkpoint torch writes does it."""
    raise pickle.UnpicklingError(f"a BUILD on a {type(self).__name__.lower()} record")


@dataclass(frozen=True, slots=True)
class DType:
    """A ``torch.<dtype>`` global."""

    __setstate__ = _no_build

    name: str


@dataclass(frozen=True, slots=True)
class StorageType:
    """A ``torch.<Name>Storage`` global: the dtype its storages hold."""

    __setstate__ = _no_build

    dtype: str


@dataclass(frozen=True, slots=True)
class Storage:
    """A storage a persistent id names: ``numel`` elements of ``dtype`` from byte ``offset`` of
    the stored bytes under ``key`` (the offset of a legacy storage view, else 0)."""

    __setstate__ = _no_build

    key: str
    dtype: str
    numel: int
    offset: int = 0

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZES[self.dtype]


@dataclass(frozen=True, slots=True)
class Tensor:
    """A strided view of a storage, as torch's ``set_(storage, offset, shape, stride)`` makes it
    (offset and strides in elements of ``dtype``)."""

    __setstate__ = _no_build

    storage: Storage
    dtype: str
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def itemsize(self) -> int:
        return ITEMSIZES[self.dtype]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    @property
    def extent(self) -> int:
        """Elements of storage the view reaches: offset + its furthest element + 1."""
        if 0 in self.shape:
            return 0
        return (
            self.offset + sum((n - 1) * s for n, s in zip(self.shape, self.stride, strict=True)) + 1
        )

    @property
    def contiguous(self) -> bool:
        expected = 1
        for n, s in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if n != 1 and s != expected:
                return False
            expected *= n
        return True


@dataclass(frozen=True, slots=True)
class NotATensor:
    """Tensor data that is not one plain strided view of a storage (a subclass, a conj/neg
    view, an impossible layout): not compared, as the conversion does not write it either."""

    __setstate__ = _no_build

    what: str


class StandIn:
    """An instance of a class the pickle names, never imported: its constructor arguments,
    items, appended values and non-attribute state are kept aside; an attribute state (BUILD
    with a dict, or a (dict, slots) pair) is its ``__dict__``, which is all a reader sees."""

    __slots__ = ("__dict__", "pickled_args", "pickled_items", "pickled_state")
    pickled_name = "?"
    pickled_args: tuple[tuple[Any, ...], dict[str, Any]]
    pickled_items: list[Any]
    pickled_state: Any

    def __new__(cls, *args: Any, **kwargs: Any) -> StandIn:  # NEWOBJ calls only this
        self = object.__new__(cls)
        self.pickled_args = (args, kwargs)
        self.pickled_items = []
        self.pickled_state = None
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        parts = state if _is_dict_pair(state) else (state,)
        if not all(p is None or isinstance(p, dict) for p in parts):
            self.pickled_state = state
            return
        for part in parts:
            self.__dict__.update(part or {})

    def __setitem__(self, key: Any, value: Any) -> None:
        self.pickled_items.append((key, value))

    def append(self, value: Any) -> None:
        self.pickled_items.append(value)

    def extend(self, values: Any) -> None:
        self.pickled_items.extend(list(values))

    def __repr__(self) -> str:
        return f"<stand-in {self.pickled_name}>"


def _is_dict_pair(state: Any) -> bool:
    return (
        isinstance(state, tuple)
        and len(state) == 2
        and all(p is None or isinstance(p, dict) for p in state)
    )


class _DefaultDict(dict[Any, Any]):
    """``collections.defaultdict`` as a plain dict: its factory is never called."""

    def __init__(self, factory: Any = None, *args: Any) -> None:
        super().__init__(*args)


# --- what torch's rebuild functions make ----------------------------------------------------


def _tensor(storage: Any, dtype: str, offset: Any, size: Any, stride: Any, meta: Any) -> Any:
    if not isinstance(storage, Storage):
        return NotATensor(f"a tensor whose storage is {type(storage).__name__}")
    if meta:  # conj/neg bits: torch reads other values than the stored bytes
        return NotATensor(f"a tensor with metadata {sorted(meta)!r:.60}")
    try:
        shape, strides = tuple(_index(n) for n in size), tuple(_index(s) for s in stride)
        start = _index(offset)
    except (TypeError, ValueError):
        return NotATensor("a tensor whose offset, size or stride is not integers")
    if len(shape) != len(strides) or min((start, *shape, *strides), default=0) < 0:
        return NotATensor(f"a tensor of size {shape}, stride {strides} at {start}")
    return Tensor(storage, dtype, start, shape, strides)


def _index(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(value)
    return value


def rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> Any:
    """``_rebuild_tensor`` and ``_rebuild_tensor_v2(…, requires_grad, hooks, metadata=None)``."""
    dtype = storage.dtype if isinstance(storage, Storage) else ""
    return _tensor(storage, dtype, offset, size, stride, rest[2] if len(rest) > 2 else None)


def rebuild_tensor_v3(
    storage: Any, offset: Any, size: Any, stride: Any, grad: Any, hooks: Any, dtype: Any, *meta: Any
) -> Any:
    """A dtype without a typed storage class: an untyped storage viewed as ``dtype``."""
    if not isinstance(dtype, DType):
        return NotATensor(f"a tensor of dtype {brief(dtype, 40)}")
    return _tensor(storage, dtype.name, offset, size, stride, meta[0] if meta else None)


def rebuild_parameter(data: Any, *rest: Any) -> Any:
    """``_rebuild_parameter(data, …)``, ``_rebuild_parameter_with_state``: the tensor itself."""
    return data


def rebuild_from_type(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    """``_rebuild_from_type(_v2)(func, type, args, state)``: ``func`` runs only when it is one of
    this module's rebuild functions; a tensor of a subclass is not a plain tensor."""
    if not any(func is f for f in _TENSOR_MAKERS) or not isinstance(args, tuple):
        return NotATensor(f"a tensor rebuilt by {getattr(func, 'pickled_name', func)!r:.60}")
    out = func(*args)
    name = getattr(new_type, "pickled_name", None)
    if isinstance(out, Tensor) and name not in _PLAIN_TENSOR_TYPES:
        return NotATensor(f"an instance of the tensor subclass {name}")
    return out


def size(shape: Any = ()) -> tuple[Any, ...]:
    """``torch.Size(shape)``: a tuple."""
    return tuple(shape) if isinstance(shape, (tuple, list)) else ()


def reconstructor(cls: Any, base: Any, state: Any) -> Any:
    """``copyreg._reconstructor(cls, base, state)`` (protocols 0 and 1) on what this module
    gives for names: a container of ``state``, or a stand-in; nothing else is called."""
    types = _CONTAINERS.values()
    if any(cls is t for t in types) and any(base is t for t in types):
        made = base.__new__(cls, state)  # as copyreg does it, on builtin containers only
        if base.__init__ is not object.__init__:
            base.__init__(made, state)
        return made
    if isinstance(cls, type) and issubclass(cls, StandIn):
        made = cls.__new__(cls)
        if base is not object:
            made.pickled_args = ((state,), {})
        return made
    return _stand_in("copyreg", "_reconstructor")(cls, base, state)


_CONTAINERS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("collections", "defaultdict"): _DefaultDict,
    ("collections", "Counter"): dict,  # Counter pickles as Counter(dict(self))
    ("builtins", "dict"): dict,
    ("builtins", "list"): list,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "tuple"): tuple,
}
_REBUILDS: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor"): rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v3"): rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type"): rebuild_from_type,
    ("torch._tensor", "_rebuild_from_type_v2"): rebuild_from_type,
    ("torch", "Size"): size,
    ("copyreg", "_reconstructor"): reconstructor,
}


_TENSOR_MAKERS = (rebuild_tensor, rebuild_tensor_v3, rebuild_parameter)


def _no_build_on_global(*args: Any) -> None:
    raise pickle.UnpicklingError("a BUILD on a global")


# A BUILD on what find_class gives looks ``__setstate__`` up on it first: on this module's own
# functions and classes (a ``__defaults__`` set through a slot state would change them for the
# rest of the process) it refuses; builtin containers refuse attributes by themselves.
for _own in (*_REBUILDS.values(), _DefaultDict):
    _own.__setstate__ = _no_build_on_global


def _stand_in(module: str, name: str) -> type[StandIn]:
    cls = type(name, (StandIn,), {"__slots__": (), "pickled_name": f"{module}.{name}"})
    cls.__module__ = module  # a string only: nothing is imported
    return cls


class RecordUnpickler(pickle.Unpickler):
    """CPython's unpickler with a ``find_class`` that never imports (see the module docstring).
    ``persistent_load`` is the layout's: it gets the pickle's persistent ids."""

    def __init__(self, file: Any, persistent: Callable[[Any], Any] | None = None) -> None:
        super().__init__(file, encoding="utf-8")  # as torch.load decodes Python 2 strings
        self.persistent = persistent
        self.stand_ins: dict[tuple[str, str], type[StandIn]] = {}

    def persistent_load(self, pid: Any) -> Any:
        if self.persistent is None:
            why = f"a persistent id where none is expected: {brief(pid, 60)}"
            raise pickle.UnpicklingError(why)
        return self.persistent(pid)

    def load(self) -> Any:
        # The C unpickler resolves EXT opcodes through a process-wide cache that bypasses
        # find_class once a code was resolved; with no code registered none can be.
        if copyreg._inverted_registry:  # type: ignore[attr-defined]
            raise pickle.UnpicklingError("pickle extension codes are registered in this process")
        return super().load()

    def find_class(self, module: str, name: str) -> Any:
        # Python 2 names as CPython's find_class maps them (and torch.tensor as torch maps it)
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        module = "torch._tensor" if module == "torch.tensor" else module
        key = (module, name)
        if key in _CONTAINERS:
            return _CONTAINERS[key]
        if key in _REBUILDS:
            return _REBUILDS[key]
        if name in STORAGE_DTYPES:  # torch.load maps a storage class by its name alone
            return StorageType(STORAGE_DTYPES[name])
        if module == "torch" and name in ITEMSIZES:
            return DType(name)
        if key not in self.stand_ins:
            self.stand_ins[key] = _stand_in(module, name)
        return self.stand_ins[key]


def storage_id(saved_id: Any) -> tuple[StorageType, str, int, Any] | None:
    """A ``('storage', type, key, location, numel[, view])`` persistent id as (type, key,
    numel, view metadata); None for any other id."""
    if not isinstance(saved_id, tuple) or len(saved_id) not in (5, 6):
        return None
    kind, stype, key, _, numel = saved_id[:5]
    if kind not in ("storage", b"storage") or not isinstance(stype, StorageType):
        return None
    if isinstance(key, bytes):
        key = key.decode("ascii")
    if not isinstance(key, (str, int)) or isinstance(numel, bool) or not isinstance(numel, int):
        return None
    return stype, str(key), numel, saved_id[5] if len(saved_id) == 6 else None
