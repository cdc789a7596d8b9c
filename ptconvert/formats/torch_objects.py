"""What the symbolic pickle tree means to torch: tensors, storages and (nested) state dicts.

``interpret`` turns the tree of ``ptconvert.scan.machine`` into plain Python values in which each
tensor is a ``TensorRef`` (storage key, dtype, shape, stride, offset): enough to describe a
checkpoint or copy its bytes, without importing torch or running any pickled call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ptconvert.scan.machine import Call, Dict, Global, PersistentRef, Unknown

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

DTYPE_SIZES: dict[str, int] = {d: s for d, s in STORAGE_DTYPES.values()}

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
class Opaque:
    """A pickled object that is not a tensor or a container: shown by its class name only."""

    cls: str


def global_name(value: Any) -> str | None:
    return f"{value.module}.{value.name}" if isinstance(value, Global) else None


def interpret(node: Any, storage_prefix: str = "") -> Any:
    """Turn a symbolic tree into plain values with TensorRef leaves (never executes anything)."""
    if isinstance(node, Dict):
        return {_key(k): interpret(v, storage_prefix) for k, v in node.items}
    if isinstance(node, list):
        return [interpret(v, storage_prefix) for v in node]
    if isinstance(node, tuple):
        return tuple(interpret(v, storage_prefix) for v in node)
    if isinstance(node, Call):
        return _interpret_call(node, storage_prefix)
    if isinstance(node, PersistentRef):  # the legacy tar layout refers to tensors by key
        return Opaque(f"pid:{node.pid}")
    if isinstance(node, (Global, Unknown)):
        return Opaque(global_name(node) or type(node).__name__)
    return node


def _key(key: Any) -> Any:
    if isinstance(key, (str, int, float, bool, type(None), bytes)):
        return key
    return repr(interpret(key))


def _interpret_call(call: Call, prefix: str) -> Any:
    fname = global_name(call.func) or ""
    args = call.args if isinstance(call.args, tuple) else ()
    short = fname.rsplit(".", 1)[-1]
    if fname in ("torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor") and args:
        storage = _storage(args[0], prefix)
        if storage is not None and len(args) >= 4:
            return TensorRef(
                storage,
                tuple(int(s) for s in args[2]),
                tuple(int(s) for s in args[3]),
                int(args[1]),
                bool(args[4]) if len(args) > 4 and isinstance(args[4], bool) else False,
            )
    if fname == "torch._utils._rebuild_tensor_v3" and len(args) >= 7:
        # dtypes without a typed storage class: an untyped (byte) storage plus a dtype global
        storage = _storage(args[0], prefix)
        dtype = (global_name(args[6]) or "").removeprefix("torch.")
        if storage is not None and dtype in DTYPE_SIZES:
            storage = StorageRef(
                storage.key, dtype, storage.numel // DTYPE_SIZES[dtype], storage.location
            )
            return TensorRef(
                storage,
                tuple(int(s) for s in args[2]),
                tuple(int(s) for s in args[3]),
                int(args[1]),
                bool(args[4]) if isinstance(args[4], bool) else False,
            )
    if fname in ("torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state"):
        return interpret(args[0], prefix) if args else Opaque(fname)
    if fname.startswith("torch._utils.") and short in _UNSUPPORTED_REBUILDS:
        return UnsupportedTensor(_UNSUPPORTED_REBUILDS[short], fname)
    if fname in ("collections.OrderedDict", "builtins.dict"):
        return {_key(k): interpret(v, prefix) for k, v in call.items}
    if isinstance(call.state, Dict):
        # an object rebuilt from its attributes (a pickled nn.Module, a TorchScript module):
        # describe its state, which is where its tensors live
        return interpret(call.state, prefix)
    return Opaque(fname or "call")


def _storage(ref: Any, prefix: str) -> StorageRef | None:
    if not isinstance(ref, PersistentRef) or not isinstance(ref.pid, tuple) or len(ref.pid) < 5:
        return None
    tag, stype, key, location, numel = ref.pid[:5]
    if tag != "storage" or not isinstance(key, str):
        return None
    cls = global_name(stype) or ""
    dtype_name = cls.rsplit(".", 1)[-1]
    if dtype_name not in STORAGE_DTYPES:
        # torch >= 2.x may store ``torch.storage.UntypedStorage`` plus a dtype global; rare.
        return None
    dtype, _ = STORAGE_DTYPES[dtype_name]
    return StorageRef(prefix + key, dtype, int(numel), str(location))


_MODULE_SLOTS = frozenset({"_parameters", "_buffers", "_modules"})


def _is_ref(value: Any) -> bool:
    return isinstance(value, (TensorRef, UnsupportedTensor))


def flatten_tensors(
    tree: Any, prefix: str = "", is_tensor: Callable[[Any], bool] = _is_ref
) -> dict[str, Any]:
    """Every tensor leaf of a nested dict/list tree, named by its dotted path.

    The same naming serves the symbolic tree (TensorRef leaves, the default) and a tree that
    torch.load returned (``is_tensor`` = isinstance of torch.Tensor), so both paths agree."""
    out: dict[str, Any] = {}
    if is_tensor(tree):
        out[prefix.rstrip(".") or "tensor"] = tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            # nn.Module state keeps tensors under these attributes; state_dict() names skip them
            part = "" if k in _MODULE_SLOTS else f"{k}."
            out.update(flatten_tensors(v, f"{prefix}{part}", is_tensor))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(flatten_tensors(v, f"{prefix}{i}.", is_tensor))
    return out
