"""Reading weights from any weights-holding format into one flat list of entries.

Each entry is a name, dtype and shape plus where its bytes are: a byte range of a file when the
bytes can be copied as they are (uncompressed zip members, the storages that follow the pickles
of the legacy layout, the storages record of a legacy tar, safetensors data), or a torch tensor
rebuilt from the storage bytes otherwise (compressed members, non-contiguous views, big-endian
storages). Names, dtypes, shapes and storages all come from the symbolic pickle reader; nothing
is unpickled. Checkpoint wrappers (``state_dict``, ``model``, …) are unwrapped and a prefix shared
by every key (``_orig_mod.``, ``module.``) is stripped, and each such step is recorded. A file
without tensors is a NoWeightsError; tensor data the reader cannot name is an error naming it
(or, with ``skip_unsupported``, left out and listed in ``WeightSet.skipped``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert.archive import read_exact
from ptconvert.errors import (
    CorruptFileError,
    NoWeightsError,
    TruncatedFileError,
    UnsupportedConversionError,
)
from ptconvert.formats import Detection, detect
from ptconvert.formats.checkpoint import PickledCheckpoint, describe_contents, read_checkpoint
from ptconvert.formats.hf import weights_file
from ptconvert.formats.safetensors import read_header
from ptconvert.formats.sharded import read_index
from ptconvert.formats.torch_objects import (
    TENSOR_LEAVES,
    Opaque,
    TensorRef,
    Unmapped,
    UnsupportedTensor,
    flatten_tensors,
)

WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "module", "ema", "ema_state_dict")
STRIPPED_PREFIXES = ("_orig_mod.", "module.")
ALIASES_KEY = "ptconvert.aliases"  # safetensors metadata: JSON {alias name: stored name}


@dataclass(frozen=True)
class ByteRange:
    path: Path
    offset: int


@dataclass
class WeightEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    source: ByteRange | None = None
    tensor: Any = None  # torch.Tensor when the bytes are not a plain file range
    alias_of: str | None = None  # tied: the entry whose data this one shares


@dataclass
class WeightSet:
    entries: list[WeightEntry]
    path: str  # "fast" (every tensor a byte range) or "torch" (some rebuilt in memory by torch)
    metadata: dict[str, str] = field(default_factory=dict)
    unwrapped: str | None = None
    stripped_prefix: str | None = None
    other_contents: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # tensors left out, name (as the entries are named) → why (``--skip-unsupported``)
    skipped: dict[str, str] = field(default_factory=dict)
    origin: Path | None = None  # the file read (a shard index for sharded sets)
    format: str = ""  # its format and layout, as detected
    layout: str = ""

    @property
    def stored(self) -> list[WeightEntry]:
        return [e for e in self.entries if e.alias_of is None]


def read_weights(
    src: Path,
    *,
    key: str | None = None,
    keep_prefix: bool = False,
    skip_unsupported: bool = False,
) -> WeightSet:
    """Every tensor of a weights file (pt, safetensors, sharded set or HF directory) or of a
    program (TorchScript, pt2: its parameters and buffers, named as its state dict names them)."""
    d = detect(src)
    if d.format == "hf":  # a directory: its weights file (or shard index) is read
        weights = weights_file(src)
        assert weights is not None
        d = detect(weights)
    reader = READERS.get(d.format)
    if reader is None:
        raise UnsupportedConversionError(
            f"ptconvert cannot read the weights of {d.format} files", path=src
        )
    ws = reader(d, key, skip_unsupported)
    ws.origin, ws.format, ws.layout = d.path, d.format, d.layout
    if not ws.entries:
        left = f" once the {len(ws.skipped)} unsupported ones are left out" if ws.skipped else ""
        raise NoWeightsError(f"the file holds no tensors{left}", path=src)
    if not keep_prefix:
        _strip_prefix(ws)
    return ws


# names an exporter makes up for constants it created (folded values, shapes, scalars)
_GENERATED = re.compile(r"^(val_\d+|_?onnx::.*|.*_output_\d+|const(ant)?_.*|\d.*)$")


def _read_onnx(path: Path) -> WeightSet:
    """An ONNX model's initializers (external data included), under the names torch's exporter
    gave them: the parameters' own names. Constants the exporter made up are listed as left
    out, with their names."""
    import torch

    from ptconvert.deps import require
    from ptconvert.formats.onnx import ONNX_DTYPES

    ir = require("onnx_ir")
    try:
        model = ir.load(str(path))
    except Exception as exc:  # protobuf and file errors alike
        raise CorruptFileError(f"not a readable ONNX model ({exc})", path=path) from None
    entries: list[WeightEntry] = []
    skipped: dict[str, str] = {}
    for name, value in model.graph.initializers.items():
        tensor = value.const_value
        if tensor is None:
            continue
        if _GENERATED.match(name) or not _TORCH_NAME.match(name):
            skipped[name] = "a constant the exporter made, not a torch parameter name"
            continue
        dtype = ONNX_DTYPES.get(int(tensor.dtype), "")
        torch_dtype = getattr(torch, dtype, None)
        if torch_dtype is None:
            skipped[name] = f"ONNX data type {tensor.dtype} has no torch dtype"
            continue
        data = bytearray(tensor.tobytes())
        t = torch.frombuffer(data, dtype=torch_dtype) if data else torch.empty(0, dtype=torch_dtype)
        shape = tuple(int(d) for d in tensor.shape)
        entries.append(WeightEntry(name, dtype, shape, len(data), tensor=t.reshape(shape)))
    ws = WeightSet(entries, "torch", skipped=skipped)
    if skipped:
        ws.notes.append(
            f"{len(skipped)} initializer(s) without a torch parameter name were left out: "
            f"{sorted(skipped)[:10]}"
        )
    return ws


_TORCH_NAME = re.compile(r"^[A-Za-z_][\w]*(\.[\w]+)*$")


def _read_pt2(d: Detection, key: str | None, skip_unsupported: bool) -> WeightSet:
    from ptconvert.formats.pt2 import weight_refs

    found = weight_refs(d.path)
    if found is None:
        return _older_pt2_weights(d.path)
    ckpt = PickledCheckpoint("zip", found[1], [], found[0])
    return _read_checkpoint(d, key, skip_unsupported, program=True, ckpt=ckpt)


def _older_pt2_weights(path: Path) -> WeightSet:
    """A .pt2 of the older layout keeps its weights in one torch.save archive inside: read
    through torch.export.load, which runs only on a file the scan finds clean."""
    from ptconvert.formats.pt2 import load_exported
    from ptconvert.scan.guard import guard

    guard(path)
    ws = weights_from_tensors(dict(load_exported(path).state_dict))
    ws.notes.append("older .pt2 layout (data/weights/<model>.pt): read with torch.export.load")
    return ws


def _read_safetensors(paths: list[Path]) -> WeightSet:
    entries: list[WeightEntry] = []
    metadata: dict[str, str] = {}
    aliases: dict[str, str] = {}
    for path in paths:
        header = read_header(path)
        metadata.update(header.metadata)
        aliases.update(json.loads(header.metadata.get(ALIASES_KEY, "{}")))
        for name, e in header.tensors.items():
            source = ByteRange(path, header.data_start + e.begin)
            shape = e.shape
            if e.dtype == "float4_e2m1fn_x2":  # safetensors counts 4-bit values, torch pairs
                if not shape or shape[-1] % 2:
                    raise UnsupportedConversionError(
                        f"tensor {name!r}: F4 shape {list(shape)} does not pack into bytes",
                        path=path,
                    )
                shape = (*shape[:-1], shape[-1] // 2)
            entries.append(WeightEntry(name, e.dtype, shape, e.end - e.begin, source))
    by_name = {e.name: e for e in entries}
    for alias, target in aliases.items():
        t = by_name[target]
        entries.append(WeightEntry(alias, t.dtype, t.shape, t.nbytes, t.source, alias_of=target))
    metadata.pop(ALIASES_KEY, None)
    return WeightSet(entries, "fast", metadata)


def _read_sharded(d: Detection) -> WeightSet:
    shards = [d.path.parent / s for s in sorted(set(read_index(d.path)["weight_map"].values()))]
    if d.layout == "safetensors":
        return _read_safetensors(shards)
    parts = [_read_checkpoint(detect(s), None, False) for s in shards]
    merged = WeightSet([e for p in parts for e in p.entries], "fast")
    if any(p.path == "torch" for p in parts):
        merged.path = "torch"
    return merged


def _read_checkpoint(
    d: Detection,
    key: str | None,
    skip_unsupported: bool,
    *,
    program: bool = False,
    ckpt: PickledCheckpoint | None = None,
) -> WeightSet:
    ckpt = ckpt or read_checkpoint(d.path, d.layout)
    others: dict[str, str] = {}
    unwrapped: str | None = None
    if program and key is None:  # a module's attributes: no checkpoint wrapper to unwrap
        tree = ckpt.tree
    else:
        tree, unwrapped, others = _unwrap(ckpt.tree, key, d.path)
    refs, skipped = _tensor_leaves(tree, d.path, skip_unsupported)
    storage = _Storages(ckpt, d.path)
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


def _read_torchscript(d: Detection, key: str | None, skip_unsupported: bool) -> WeightSet:
    """A TorchScript archive's weights are its ``state_dict()`` (parameters and buffers);
    other tensor attributes (runtime state) are named in a note, not written."""
    from dataclasses import replace

    from ptconvert.formats.torchscript import module_state

    ckpt = read_checkpoint(d.path, d.layout)
    tree, dropped = module_state(ckpt) if key is None else (ckpt.tree, [])
    ws = _read_checkpoint(d, key, skip_unsupported, program=True, ckpt=replace(ckpt, tree=tree))
    if dropped:
        ws.notes.append(
            f"{len(dropped)} tensor attributes that are not parameters or buffers left out "
            f"(the module's state_dict() does not hold them): {', '.join(dropped[:10])}"
        )
    return ws


class _Storages:
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


def _strip_prefix(ws: WeightSet) -> None:
    names = [e.name for e in ws.entries] + list(ws.skipped)
    stripped = ""
    while names:
        prefix = next((p for p in STRIPPED_PREFIXES if all(n.startswith(p) for n in names)), None)
        if prefix is None:
            break
        stripped += prefix
        names = [n[len(prefix) :] for n in names]
    if not stripped:
        return
    cut = len(stripped)
    for e in ws.entries:
        e.name = e.name[cut:]
        if e.alias_of is not None:
            e.alias_of = e.alias_of[cut:]
    ws.skipped = {k[cut:]: v for k, v in ws.skipped.items()}
    ws.stripped_prefix = stripped


def as_tensors(ws: WeightSet) -> dict[str, Any]:
    """Torch tensors for every entry, backed by a private mmap of the source (copy-on-write,
    nothing read until used); tied entries are the same tensor."""
    import mmap

    import torch

    from ptconvert.deps import torch_dtype

    maps: dict[Path, mmap.mmap] = {}
    out: dict[str, Any] = {}
    for e in ws.stored:
        if e.tensor is not None:
            out[e.name] = e.tensor
            continue
        assert e.source is not None
        dtype = torch_dtype(e.dtype, f"loading tensor {e.name!r} into torch", path=e.source.path)
        if e.nbytes == 0:
            out[e.name] = torch.empty(e.shape, dtype=dtype)
            continue
        if e.source.path not in maps:
            with open(e.source.path, "rb") as fh:
                maps[e.source.path] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        flat = torch.frombuffer(
            maps[e.source.path], dtype=torch.uint8, count=e.nbytes, offset=e.source.offset
        )
        out[e.name] = flat.view(dtype).reshape(e.shape)
    for e in ws.entries:
        if e.alias_of is not None:
            out[e.name] = out[e.alias_of]
    return out


def weights_from_tensors(tensors: dict[str, Any]) -> WeightSet:
    """A weight set over in-memory tensors (from a loaded program); tied tensors become aliases."""
    entries: list[WeightEntry] = []
    seen: dict[tuple[object, ...], str] = {}
    for name, t in tensors.items():
        t = t.detach()
        ident = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        dtype = str(t.dtype).removeprefix("torch.")
        nbytes = t.numel() * t.element_size()
        if ident in seen:
            entries.append(WeightEntry(name, dtype, tuple(t.shape), nbytes, alias_of=seen[ident]))
            continue
        seen[ident] = name
        entries.append(WeightEntry(name, dtype, tuple(t.shape), nbytes, tensor=t))
    return WeightSet(entries, "torch")


# A weights reader per format: (detection, --key, --skip-unsupported) → WeightSet. The formats
# a conversion reads weights from are this table's keys (and "hf", whose file is one of them);
# a plugin adds its own with ``Registry.add_weights_reader``.
Reader = Callable[[Detection, "str | None", bool], WeightSet]
READERS: dict[str, Reader] = {
    "safetensors": lambda d, key, skip: _read_safetensors([d.path]),
    "sharded": lambda d, key, skip: _read_sharded(d),
    "pt": lambda d, key, skip: _read_checkpoint(d, key, skip),
    # the attributes pickle, read symbolically: the program is never loaded for its weights
    "torchscript": lambda d, key, skip: _read_torchscript(d, key, skip),
    "pt2": _read_pt2,
    "onnx": lambda d, key, skip: _read_onnx(d.path),
}


def weight_sources() -> set[str]:
    """The formats whose weights can be read (directories of them included)."""
    return {*READERS, "hf"}
