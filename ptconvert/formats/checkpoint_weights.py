"""The weights of a torch pickle checkpoint, read from the symbolic pickle reader's tree:
nothing is unpickled. Checkpoint wrappers (``state_dict``, ``model``, …) are unwrapped; each
tensor's bytes are a byte range of the file where they lie as they are (uncompressed zip members,
the storages after a legacy file's pickles, a legacy tar's storages record), else a tensor rebuilt
from its storage (compressed members, non-contiguous views, big-endian storages). Tensor data the
reader cannot name is an error naming it (or, with ``skip_unsupported``, left out and listed).
TorchScript and pt2 archives read their attributes pickle through ``read_checkpoint_weights``
too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ptconvert.archive import read_exact
from ptconvert.errors import (
    CorruptFileError,
    NoWeightsError,
    TruncatedFileError,
    UnsupportedConversionError,
)
from ptconvert.formats.checkpoint import PickledCheckpoint, describe_contents, read_checkpoint
from ptconvert.formats.torch_objects import (
    TENSOR_LEAVES,
    Opaque,
    TensorRef,
    Unmapped,
    UnsupportedTensor,
    flatten_tensors,
)
from ptconvert.formats.weightset import ByteRange, WeightEntry, WeightSet

WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "module", "ema", "ema_state_dict")


def read_checkpoint_weights(
    path: Path,
    layout: str,
    key: str | None,
    skip_unsupported: bool,
    *,
    program: bool = False,
    ckpt: PickledCheckpoint | None = None,
) -> WeightSet:
    """The tensors of a pickle checkpoint (or of a program's attributes pickle, ``program``):
    the state dict found inside the checkpoint's wrapper (or ``key``), each tensor a byte range
    of the file where its bytes lie as they are, else rebuilt from its storage."""
    ckpt = ckpt or read_checkpoint(path, layout)
    others: dict[str, str] = {}
    unwrapped: str | None = None
    if program and key is None:  # a module's attributes: no checkpoint wrapper to unwrap
        tree = ckpt.tree
    else:
        tree, unwrapped, others = _unwrap(ckpt.tree, key, path)
    refs, skipped = _tensor_leaves(tree, path, skip_unsupported)
    storage = Storages(ckpt, path)
    entries: list[WeightEntry] = []
    seen: dict[tuple[object, ...], str] = {}
    rebuilt: list[str] = []
    for name, t in refs.items():
        ident = (t.storage.key, t.dtype, t.offset, t.shape, t.stride)
        if ident in seen:
            entries.append(WeightEntry(name, t.dtype, t.shape, t.nbytes, alias_of=seen[ident]))
            continue
        seen[ident] = name
        source, why = storage.locate(name, t)
        if source is not None:
            entries.append(WeightEntry(name, t.dtype, t.shape, t.nbytes, source))
        else:
            tensor = storage.rebuild(t)
            entries.append(WeightEntry(name, t.dtype, t.shape, t.nbytes, tensor=tensor))
            rebuilt.append(why)
    fast = not rebuilt
    ws = WeightSet(entries, "fast" if fast else "torch", unwrapped=unwrapped, other_contents=others)
    ws.skipped = skipped
    if rebuilt:
        reasons = ", ".join(sorted(set(rebuilt)))
        ws.notes.append(f"{len(rebuilt)} tensors rebuilt in memory from their storages ({reasons})")
    return ws


class Storages:
    """Where each storage's bytes are: a zip member, or a byte range of a legacy or tar file."""

    def __init__(self, ckpt: PickledCheckpoint, path: Path) -> None:
        self.ckpt, self.path = ckpt, path
        self.little = ckpt.byteorder == "little"
        self.cache: dict[str, Any] = {}

    def _span(self, name: str, t: TensorRef) -> tuple[int, int, bool]:
        """(file offset, bytes available, stored as is) of the tensor's storage."""
        archive = self.ckpt.archive
        if archive is not None:
            member = archive.member(t.storage.key)
            if member is None:
                raise CorruptFileError(
                    f"tensor {name!r}: storage {t.storage.key} is missing", path=self.path
                )
            return member.data_offset, member.size, member.compress_type == 0
        if t.storage.key not in self.ckpt.storages:
            raise CorruptFileError(
                f"tensor {name!r}: storage {t.storage.key} is not in the file", path=self.path
            )
        start, size = self.ckpt.storages[t.storage.key]
        return start, size, True

    def locate(self, name: str, t: TensorRef) -> tuple[ByteRange | None, str]:
        """The tensor's bytes as a file range, or None and why it must be rebuilt."""
        if (
            t.offset < 0
            or len(t.shape) != len(t.stride)
            or min((*t.shape, *t.stride), default=0) < 0
        ):
            raise CorruptFileError(
                f"tensor {name!r} has an impossible layout (offset {t.offset}, shape "
                f"{list(t.shape)}, stride {list(t.stride)})",
                path=self.path,
            )
        start, size, stored = self._span(name, t)
        need = _extent(t) * t.itemsize
        if size < need:
            raise TruncatedFileError(
                f"tensor {name!r} needs {need} bytes of storage {t.storage.key}, "
                f"which holds {size}",
                path=self.path,
            )
        if not self.little and t.itemsize > 1 and t.storage.untyped:
            raise UnsupportedConversionError(
                f"tensor {name!r} ({t.dtype}) is stored big-endian in an untyped storage, which "
                "torch.load does not byte-swap: its values are ambiguous",
                path=self.path,
            )
        if not stored:
            return None, "compressed storages"
        if not self.little and t.itemsize > 1:
            return None, "big-endian storages, byte-swapped"
        if not t.is_contiguous:
            return None, "non-contiguous views"
        return ByteRange(self.path, start + t.offset * t.itemsize), ""

    def rebuild(self, t: TensorRef) -> Any:
        """A contiguous little-endian torch tensor of ``t``, read from its storage bytes."""
        import torch

        from ptconvert.deps import torch_dtype

        raw = self.cache.get(t.storage.key)
        if raw is None:
            archive = self.ckpt.archive
            member = archive.member(t.storage.key) if archive is not None else None
            if archive is not None and member is not None:
                # as much as the pickle declares the storage holds, never what the member claims
                data = archive.inflate(member, min(member.size, t.storage.nbytes))
            else:
                start, size, _ = self._span(t.storage.key, t)
                data = read_exact(self.path, start, size)
            u8 = torch.uint8
            raw = torch.frombuffer(data, dtype=u8) if data else torch.empty(0, dtype=u8)
            self.cache[t.storage.key] = raw
        size = t.itemsize
        # gather the view's elements as rows of bytes: works alike for every dtype
        rows = raw.as_strided(
            (*t.shape, size), (*(st * size for st in t.stride), 1), t.offset * size
        ).contiguous()
        if not self.little and size > 1:
            # complex numbers swap each of their two halves, as torch does
            unit = size // 2 if t.dtype.startswith("complex") else size
            rows = rows.reshape(-1, unit).flip(1).contiguous()
        dtype = torch_dtype(t.dtype, f"rebuilding {t.dtype} tensors in memory", path=self.path)
        return rows.reshape(-1).view(dtype).reshape(t.shape)


def _extent(t: TensorRef) -> int:
    """Elements of storage the view reaches: offset + the furthest element + 1."""
    if any(s == 0 for s in t.shape):
        return 0
    return t.offset + sum((n - 1) * st for n, st in zip(t.shape, t.stride, strict=True)) + 1


def _unwrap(tree: Any, key: str | None, path: Path) -> tuple[Any, str | None, dict[str, str]]:
    """The state dict inside a checkpoint: ``key`` if given, else the first known wrapper."""
    if not isinstance(tree, dict):
        _not_a_mapping(tree, path)
        return tree, None, {}  # a list, tuple or single tensor: named by position
    if key is not None:
        if key not in tree:
            raise UnsupportedConversionError(
                f"--key {key!r} is not in the checkpoint (keys: {sorted(map(str, tree))})",
                path=path,
            )
        chosen: str | None = key
    elif all(_is_tensor(v) for v in tree.values()):
        return tree, None, {}
    else:
        chosen = next((k for k in WRAPPER_KEYS if isinstance(tree.get(k), dict)), None)
        if chosen is None:
            chosen = _model_part(tree, path)
        if chosen is None:
            return tree, None, {}
    others = describe_contents({k: v for k, v in tree.items() if k != chosen})
    return tree[chosen], chosen, others


def _is_optimizer_state(value: Any) -> bool:
    return isinstance(value, dict) and {"state", "param_groups"} <= set(value)


def _model_part(tree: dict[Any, Any], path: Path) -> str | None:
    """In a training checkpoint that holds optimizer state, the one entry that holds the model's
    tensors (optimizer moments are not weights); None when there is no optimizer state."""
    if not any(_is_optimizer_state(v) for v in tree.values()):
        return None
    candidates = [
        k
        for k, v in tree.items()
        if isinstance(v, dict) and not _is_optimizer_state(v) and flatten_tensors(v)
    ]
    loose = [k for k, v in tree.items() if _is_tensor(v)]
    if len(candidates) == 1 and not loose:
        return str(candidates[0])
    raise UnsupportedConversionError(
        "the checkpoint holds optimizer state beside the weights; which entry is the model's? "
        f"candidates: {sorted(map(str, candidates + loose))}",
        path=path,
        hint="pass --key ENTRY",
    )


def _not_a_mapping(tree: Any, path: Path) -> None:
    """A root that is not a dict: a list or tuple of tensors converts (named by position), a
    whole object cannot, a file without tensors says so."""
    if isinstance(tree, (list, tuple, *TENSOR_LEAVES)) and flatten_tensors(tree):
        return
    what = describe_contents(tree)["<root>"]
    if isinstance(tree, Opaque):
        raise UnsupportedConversionError(
            f"the checkpoint is a whole pickled object ({what}), not a dict of tensors",
            path=path,
            hint="whole-module pickles need --trust and the converter graph",
        )
    raise NoWeightsError(f"the file holds no tensors (it holds {what})", path=path)


def _is_tensor(value: Any) -> bool:
    return isinstance(value, TENSOR_LEAVES) or type(value).__name__ in ("Tensor", "Parameter")


def _tensor_leaves(
    tree: Any, path: Path, skip_unsupported: bool
) -> tuple[dict[str, TensorRef], dict[str, str]]:
    out: dict[str, TensorRef] = {}
    skipped: dict[str, str] = {}
    collisions: list[str] = []
    for name, t in flatten_tensors(tree, collisions=collisions).items():
        problem = _problem(name, t)
        if problem is None:
            out[name] = t
        elif skip_unsupported:
            skipped[name] = problem
        else:
            raise UnsupportedConversionError(
                problem,
                path=path,
                hint="pass --skip-unsupported to leave it out (it is then reported)",
            )
    if collisions:
        raise UnsupportedConversionError(
            f"two entries of the checkpoint flatten to the same tensor name: {collisions[:5]}",
            path=path,
            hint="pass --key to convert one sub-dict",
        )
    return out, skipped


def _problem(name: str, t: Any) -> str | None:
    if isinstance(t, UnsupportedTensor):
        return f"tensor {name!r} is a {t.kind} tensor, which plain weight files cannot hold"
    if isinstance(t, Unmapped):
        return f"cannot read the tensor data at {name!r}: {t.construct} ({t.reason})"
    if t.dtype.startswith(("qint", "quint")):
        return f"tensor {name!r} has the quantized dtype {t.dtype} without its quantizer"
    return None
