"""What the symbolic pickle tree means to torch: tensors, storages and (nested) state dicts.

``interpret`` turns the tree of ``ptconvert.pickles.machine`` into plain Python values in which each
tensor is a ``TensorRef`` (storage key, dtype, shape, stride, offset): enough to describe a
checkpoint or copy its bytes, without importing torch or running any pickled call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ptconvert.pickles.records import (
    MAX_INT_BITS,
    MAX_NESTING,
    Call,
    Dict,
    Global,
    PersistentRef,
    Unknown,
    brief,
)

# torch storage class name → (dtype name, bytes per element)
STORAGE_DTYPES: dict[str, tuple[str, int]] = {
    "DoubleStorage": ("float64", 8),
    "FloatStorage": ("float32", 4),
    "HalfStorage": ("float16", 2),
    "BFloat16Storage": ("bfloat16", 2),
    "LongStorage": ("int64", 8),
    "IntStorage": ("int32", 4),
    "ShortStorage": ("int16", 2),
    "CharStorage": ("int8", 1),
    "ByteStorage": ("uint8", 1),
    "BoolStorage": ("bool", 1),
    "ComplexFloatStorage": ("complex64", 8),
    "ComplexDoubleStorage": ("complex128", 16),
    "ComplexHalfStorage": ("complex32", 4),
    "UInt16Storage": ("uint16", 2),
    "UInt32Storage": ("uint32", 4),
    "UInt64Storage": ("uint64", 8),
    "Float8_e4m3fnStorage": ("float8_e4m3fn", 1),
    "Float8_e5m2Storage": ("float8_e5m2", 1),
    "Float8_e4m3fnuzStorage": ("float8_e4m3fnuz", 1),
    "Float8_e5m2fnuzStorage": ("float8_e5m2fnuz", 1),
    "Float8_e8m0fnuStorage": ("float8_e8m0fnu", 1),
    "QInt8Storage": ("qint8", 1),
    "QUInt8Storage": ("quint8", 1),
    "QInt32Storage": ("qint32", 4),
    "QUInt4x2Storage": ("quint4x2", 1),
    "QUInt2x4Storage": ("quint2x4", 1),
    "UntypedStorage": ("uint8", 1),
}

# every torch dtype → bytes per element (``torch.<name>.itemsize``), without importing torch
DTYPE_SIZES: dict[str, int] = {
    **dict(STORAGE_DTYPES.values()),
    "bcomplex32": 4,  # torch 2.14: two bfloat16; saved in an UntypedStorage, no typed class
    "float4_e2m1fn_x2": 1,  # two 4-bit values per byte
    "bits1x8": 1,
    "bits2x4": 1,
    "bits4x2": 1,
    "bits8": 1,
    "bits16": 2,
    **{f"{sign}int{bits}": 1 for sign in ("", "u") for bits in range(1, 8)},
}

# Rebuild functions for tensors that are not a plain strided view of one storage.
_UNSUPPORTED_REBUILDS = {
    "_rebuild_qtensor": "quantized",
    "_rebuild_sparse_tensor": "sparse",
    "_rebuild_sparse_csr_tensor": "sparse",
    "_rebuild_nested_tensor": "nested",
    "_rebuild_wrapper_subclass": "tensor subclass",
    "_rebuild_meta_tensor_no_storage": "meta (no data)",
    "_rebuild_device_tensor_from_numpy": "device tensor from numpy",
    "_rebuild_xla_tensor": "xla",
    "_rebuild_mtia_tensor": "mtia",
}


@dataclass(frozen=True)
class StorageRef:
    key: str
    dtype: str
    numel: int
    location: str
    untyped: bool = False  # an UntypedStorage whose dtype the tensor names (``_rebuild_tensor_v3``)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_SIZES.get(self.dtype, 1)


@dataclass(frozen=True)
class TensorRef:
    """A tensor as the pickle describes it: a strided view into a storage."""

    storage: StorageRef
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int  # in elements
    requires_grad: bool = False

    @property
    def dtype(self) -> str:
        return self.storage.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return DTYPE_SIZES.get(self.dtype, 1)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def is_contiguous(self) -> bool:
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True


@dataclass(frozen=True)
class UnsupportedTensor:
    """A tensor that is not one strided view of a storage (quantized, sparse, nested, …)."""

    kind: str
    rebuild: str


@dataclass(frozen=True)
class Unmapped:
    """Tensor data the reader sees but cannot name: inside a set or an object it does not model,
    a storage pickled on its own, a tensor whose storage is not a reference to stored bytes.

    It stands where the tensors would be, so that a conversion fails naming the construct instead
    of silently leaving its tensors out."""

    construct: str  # what holds the data, e.g. "builtins.set", "torch.storage._load_from_bytes"
    reason: str


@dataclass(frozen=True)
class Opaque:
    """A pickled object that is not a tensor or a container: shown by its class name only."""

    cls: str


TENSOR_LEAVES = (TensorRef, UnsupportedTensor, Unmapped)

# Paths that values shared by reference may add to a tree, beyond its distinct parts (tied
# weights add a few): a pickle of 100 bytes can share tuples so that a walk of every path (as
# ``flatten_tensors`` names tensors) visits 2**40 values.
MAX_SHARED_PATHS = 100_000
_INT64 = 1 << 63
# the constructs of an ``Unmapped`` where the reading stopped: too deep, too shared
NESTING, SHARED = "nesting", "shared values"

# callables that build a mapping; their items become a plain dict
DICT_BUILDERS = frozenset(
    {
        "collections.OrderedDict",
        "builtins.dict",
        "collections.Counter",
        "collections.defaultdict",
    }
)
_TENSOR_REBUILDS = frozenset(
    {
        "torch._utils._rebuild_tensor",
        "torch._utils._rebuild_tensor_v2",
        "torch._utils._rebuild_tensor_v3",
    }
)
_PARAMETER_REBUILDS = frozenset(
    {"torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state"}
)
# ``_rebuild_from_type_v2`` types whose tensors are plain tensors (extra Python attributes aside)
_PLAIN_TENSOR_TYPES = frozenset(
    {"torch.Tensor", "torch.nn.parameter.Parameter", "torch.nn.parameter.Buffer"}
)


def global_name(value: Any) -> str | None:
    return f"{value.module}.{value.name}" if isinstance(value, Global) else None


def interpret(
    node: Any, storage_prefix: str = "", persistent: Callable[[Any], Any] | None = None
) -> Any:
    """Turn a symbolic tree into plain values with TensorRef leaves (never executes anything).

    Every way a pickle builds a mapping becomes a dict: DICT/SETITEM(S), ``OrderedDict``/``dict``
    called on a list or tuple of (key, value) pairs or on another mapping, keyword arguments,
    ``copyreg._reconstructor`` over ``dict``. Tensor data the reader cannot name becomes an
    ``Unmapped`` leaf naming its construct; it never disappears. ``persistent`` resolves the
    persistent ids that are not storages (the legacy tar layout refers to tensors by key)."""
    return _Interpreter(storage_prefix, persistent).value(node)


class _Interpreter:
    def __init__(self, prefix: str, persistent: Callable[[Any], Any] | None) -> None:
        self.prefix = prefix
        self.persistent = persistent
        # results by node identity: a memoized subtree is read once (a pickle may reference one
        # object many times), and a node met again while it is read is a cycle
        self.done: dict[int, Any] = {}
        self.active: set[int] = set()  # the nodes being read: a path from the root
        self.alive: list[Any] = []  # keeps every memoized node alive, so that ids stay unique
        # values a walk of each result container visits, by id (results stay alive in ``done``),
        # and the children of every distinct result container so far
        self.paths: dict[int, int] = {}
        self.edges = 0

    def value(self, node: Any) -> Any:
        if not isinstance(node, (Dict, list, tuple, Call)):
            return self._value(node)
        key = id(node)
        if key in self.done:
            return self.done[key]
        if key in self.active:
            return Opaque("<recursive reference>")
        if len(self.active) >= MAX_NESTING:  # the reading recurses: bounded, and said
            return Unmapped(NESTING, f"nested deeper than {MAX_NESTING} levels: not read")
        self.active.add(key)
        try:
            out = self._value(node)
        finally:
            self.active.discard(key)
        if self._paths(out) > self.edges + MAX_SHARED_PATHS:
            self.alive.append(out)  # counted by id: that id stays its own
            out = Unmapped(
                SHARED,
                f"shared so often that naming them would visit over {MAX_SHARED_PATHS:,} values",
            )
        self.done[key] = out
        self.alive.append(node)
        return out

    def _paths(self, out: Any) -> int:
        """Values a walk of ``out`` visits, each shared one once per path (its children were
        made first, so their counts are known)."""
        if not isinstance(out, (dict, list, tuple)):
            return 1
        if id(out) not in self.paths:  # a result may stand for two nodes: counted once
            children = out.values() if isinstance(out, dict) else out
            self.paths[id(out)] = 1 + sum(self.paths.get(id(c), 1) for c in children)
            self.edges += len(children)
        return self.paths[id(out)]

    def _value(self, node: Any) -> Any:
        if isinstance(node, Dict):
            return dict(self.items(node.items))
        if isinstance(node, list):
            return [self.value(v) for v in node]
        if isinstance(node, tuple):
            return tuple(self.value(v) for v in node)
        if isinstance(node, Call):
            return self.call(node)
        if isinstance(node, PersistentRef):
            if _is_storage_pid(node.pid):
                return Unmapped("torch storage", "a storage pickled on its own, not in a tensor")
            if self.persistent is not None:
                return self.persistent(node.pid)
            return _foreign_pid(node.pid)
        if isinstance(node, (Global, Unknown)):
            return Opaque(global_name(node) or type(node).__name__)
        if isinstance(node, int) and node.bit_length() > MAX_INT_BITS:
            return Opaque(f"int of {node.bit_length()} bits")  # too long to print
        return node

    def key(self, key: Any) -> Any:
        if isinstance(key, (str, float, bool, type(None), bytes)) or (
            isinstance(key, int) and key.bit_length() <= MAX_INT_BITS
        ):
            return key
        return brief(self.value(key), None)

    def items(self, items: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        return [(self.key(k), self.value(v)) for k, v in items]

    def call(self, call: Call) -> Any:
        fname = global_name(call.func) or ""
        args = call.args if isinstance(call.args, tuple) else ()
        short = fname.rsplit(".", 1)[-1]
        if fname in _TENSOR_REBUILDS:
            return self.tensor(fname, args)
        if fname in _PARAMETER_REBUILDS:
            inner = self.value(args[0]) if args else None
            if isinstance(inner, TENSOR_LEAVES):
                return inner
            return Unmapped(fname, "the parameter's data is not a tensor the reader understands")
        if fname == "torch._tensor._rebuild_from_type_v2" and len(args) >= 3:
            return self.typed_tensor(args)
        if fname.startswith("torch._utils.") and short in _UNSUPPORTED_REBUILDS:
            return UnsupportedTensor(_UNSUPPORTED_REBUILDS[short], fname)
        if fname in DICT_BUILDERS:
            # defaultdict(factory[, mapping]); the others (mapping_or_pairs)
            sources = args[1:2] if fname == "collections.defaultdict" else args[:1]
            return self.mapping(call, fname, sources)
        if (
            fname == "copyreg._reconstructor"
            and len(args) >= 3
            and global_name(args[1]) == "builtins.dict"
        ):
            # dict.__new__(cls, state); dict.__init__(obj, state): a dict (subclass) of ``state``
            return self.mapping(call, global_name(args[0]) or fname, args[2:3])
        attributes = _attribute_state(call.state)
        if attributes is not None:
            # an object rebuilt from its attributes (a pickled nn.Module, a TorchScript module):
            # describe its state, which is where its tensors live
            out = self.value(attributes)
            rest = self.value([call.args, call.kwargs, call.items, call.appends])
            why = _unmapped(rest, fname or "call", "tensors among its constructor arguments")
            return out if why is None else why
        inside = self.value([call.args, call.kwargs, call.state, call.items, call.appends])
        why = _unmapped(
            inside, fname or "call", "holds tensor data in an object ptconvert cannot read"
        )
        return Opaque(fname or "call") if why is None else why

    def mapping(self, call: Call, fname: str, sources: tuple[Any, ...]) -> Any:
        out: dict[Any, Any] = {}
        for src in sources:
            pairs = self.pairs(src, fname)
            if isinstance(pairs, Unmapped):
                return pairs
            out.update(pairs)
        if isinstance(call.kwargs, Dict):
            out.update(self.items(call.kwargs.items))
        out.update(self.items(call.items))
        # BUILD state of a dict is its attributes (``_metadata`` of a state dict), never items
        rest = self.value([call.state, call.appends])
        why = _unmapped(rest, fname, "tensors stored as attributes of a dict, not as its items")
        return out if why is None else why

    def pairs(self, src: Any, fname: str) -> list[tuple[Any, Any]] | Unmapped:
        if src is None:
            return []
        if isinstance(src, Dict):
            return self.items(src.items)
        if isinstance(src, (list, tuple)) and all(
            isinstance(p, (list, tuple)) and len(p) == 2 for p in src
        ):
            return [(self.key(k), self.value(v)) for k, v in src]
        value = self.value(src)
        if isinstance(value, dict):
            return list(value.items())
        why = _unmapped(value, fname, "built from something that is not (key, value) pairs")
        return [] if why is None else why  # e.g. Counter over a string: no tensors either way

    def tensor(self, fname: str, args: tuple[Any, ...]) -> TensorRef | Unmapped:
        need = 7 if fname.endswith("_v3") else 4
        if len(args) < need:
            return Unmapped(fname, f"called with {len(args)} arguments")
        found = self.storage(args[0])
        if isinstance(found, Unmapped):
            return found
        storage, view_offset = found
        if fname.endswith("_v3"):
            # dtypes without a typed storage class: an untyped (byte) storage plus a dtype global
            dtype = (global_name(args[6]) or brief(args[6])).removeprefix("torch.")
            if dtype not in DTYPE_SIZES:
                return Unmapped(fname, f"unknown dtype {dtype}")
            size = DTYPE_SIZES[dtype]
            storage = StorageRef(
                storage.key, dtype, storage.nbytes // size, storage.location, untyped=True
            )
            view_offset //= size
        try:
            shape = tuple(int(s) for s in args[2])
            stride = tuple(int(s) for s in args[3])
            offset = int(args[1]) + view_offset
        except (TypeError, ValueError, OverflowError):
            return Unmapped(fname, "its size, stride or offset is not a tuple of integers")
        if any(not -_INT64 <= n < _INT64 for n in (*shape, *stride, offset)):
            return Unmapped(fname, "its size, stride or offset does not fit in 64 bits")
        if len(shape) != len(stride):
            return Unmapped(fname, f"size {shape} and stride {stride} differ in length")
        grad = len(args) > 4 and isinstance(args[4], bool) and args[4]
        return TensorRef(storage, shape, stride, offset, grad)

    def typed_tensor(self, args: tuple[Any, ...]) -> Any:
        """``_rebuild_from_type_v2(func, type, args, state)``: a tensor with Python attributes,
        or an instance of a tensor subclass."""
        new_type = global_name(args[1]) or "?"
        inner = self.value(Call(args[0], args[2], "REDUCE", -1))  # its depth counts
        if isinstance(inner, TensorRef) and new_type not in _PLAIN_TENSOR_TYPES:
            return UnsupportedTensor(f"tensor subclass {new_type}", "_rebuild_from_type_v2")
        if isinstance(inner, TENSOR_LEAVES):
            return inner
        return Unmapped(f"{new_type} via _rebuild_from_type_v2", "its data is not a tensor")

    def storage(self, ref: Any) -> tuple[StorageRef, int] | Unmapped:
        """The storage a tensor views, and the element offset of a (legacy) storage view."""
        if not isinstance(ref, PersistentRef):
            what = global_name(ref.func) if isinstance(ref, Call) else None
            if what == "torch.storage._load_from_bytes":
                return Unmapped(
                    what,
                    "a tensor written with plain pickle: its storage is a nested torch.save that "
                    "only a full unpickle reads (torch.load(weights_only=True) refuses it too)",
                )
            return Unmapped(
                what or type(ref).__name__,
                "a tensor's storage that is not a reference to stored bytes",
            )
        if not _is_storage_pid(ref.pid):
            return _foreign_pid(ref.pid)
        _, stype, key, location, numel = ref.pid[:5]
        cls = global_name(stype) or brief(stype)
        dtype_name = cls.rsplit(".", 1)[-1]
        if dtype_name not in STORAGE_DTYPES:
            return Unmapped(cls, "unknown storage class")
        dtype, _ = STORAGE_DTYPES[dtype_name]
        offset = 0
        view = ref.pid[5] if len(ref.pid) > 5 else None
        if isinstance(view, tuple) and len(view) == 3 and isinstance(view[1], int):
            offset = view[1]  # legacy storage view: (view key, offset, size) into the root
        elif view is not None:
            return Unmapped("storage view", f"unexpected view metadata {brief(view)}")
        if not isinstance(numel, int) or not -_INT64 <= numel < _INT64:
            return Unmapped(cls, f"storage size {brief(numel, 40)} is not a 64-bit integer")
        return StorageRef(self.prefix + _text(key), dtype, numel, _text(location)), offset


def _text(value: Any) -> str:
    if isinstance(value, (str, bytes)):
        return value.decode("latin-1") if isinstance(value, bytes) else value
    return brief(value, None)  # str() of a pickled value may never end


def _foreign_pid(pid: Any) -> Unmapped:
    if isinstance(pid, str) and pid.startswith("('storage'"):
        return Unmapped(
            "protocol 0 storage reference",
            "a persistent id written as text, which torch.load cannot read either",
        )
    return Unmapped("persistent id", f"not a reference to a stored storage: {brief(pid)}")


def _is_storage_pid(pid: Any) -> bool:
    return (
        isinstance(pid, tuple)
        and len(pid) >= 5
        and pid[0] in ("storage", b"storage")
        and isinstance(pid[2], (str, bytes, int))
    )


def _attribute_state(state: Any) -> Any:
    """What BUILD sets as attributes: a dict, or the dicts of a (dict, slots) pair."""
    if isinstance(state, Dict):
        return state
    if isinstance(state, tuple) and len(state) == 2:
        parts = [p for p in state if isinstance(p, Dict)]
        if parts and all(p is None or isinstance(p, Dict) for p in state):
            return Dict([item for p in parts for item in p.items])
    return None


def _unmapped(tree: Any, construct: str, reason: str) -> Unmapped | None:
    """``Unmapped(construct, reason)`` when an interpreted value holds a tensor leaf anywhere
    (the first one found, where the reading stopped, says why instead); None if it holds none."""
    seen: set[int] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, Unmapped) and node.construct in (NESTING, SHARED):
            return node
        if isinstance(node, TENSOR_LEAVES):
            return Unmapped(construct, reason)
        if isinstance(node, (dict, list, tuple)) and id(node) not in seen:
            seen.add(id(node))
            stack.extend(node.values() if isinstance(node, dict) else node)
    return None


_MODULE_SLOTS = frozenset({"_parameters", "_buffers", "_modules"})


def _is_ref(value: Any) -> bool:
    return isinstance(value, TENSOR_LEAVES)


def flatten_tensors(
    tree: Any,
    prefix: str = "",
    is_tensor: Callable[[Any], bool] = _is_ref,
    collisions: list[str] | None = None,
) -> dict[str, Any]:
    """Every tensor leaf of a nested dict/list tree, named by its dotted path.

    The same naming serves the symbolic tree (TensorRef leaves, the default) and a tree that
    torch.load returned (``is_tensor`` = isinstance of torch.Tensor), so both paths agree. A name
    that two leaves flatten to (``{"a": {"b": x}, "a.b": y}``) keeps the last leaf and is added
    to ``collisions`` when given. Depth-first and iterative: any nesting depth works."""
    out: dict[str, Any] = {}
    # ``inside`` holds the containers enclosing the entry popped (each entered one is left by the
    # id pushed below its children): a container inside itself (a cycle torch.load can return)
    # is not entered again, a container shared by two paths is named twice
    stack: list[tuple[Any, str] | int] = [(tree, prefix)]
    inside: set[int] = set()
    while stack:
        entry = stack.pop()
        if isinstance(entry, int):
            inside.discard(entry)
            continue
        node, path = entry
        if is_tensor(node):
            name = path.rstrip(".") or "tensor"
            if name in out and collisions is not None:
                collisions.append(name)
            out[name] = node
        elif isinstance(node, (dict, list, tuple)) and id(node) not in inside:
            inside.add(id(node))
            stack.append(id(node))
            if isinstance(node, dict):
                # nn.Module state keeps tensors under these attributes; state_dict() names skip them
                children = [
                    (v, f"{path}{'' if k in _MODULE_SLOTS else f'{k}.'}") for k, v in node.items()
                ]
            else:
                children = [(v, f"{path}{i}.") for i, v in enumerate(node)]
            stack.extend(reversed(children))
    return out
