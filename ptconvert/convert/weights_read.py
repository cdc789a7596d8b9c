"""Reading weights from any weights-holding format into one flat list of entries.

Each entry is a name, dtype and shape plus where its bytes are: a byte range of a file when the
bytes can be copied as they are (uncompressed zip members, safetensors data), or a torch tensor
otherwise (legacy layouts, compressed members, non-contiguous views). Checkpoint wrappers
(``state_dict``, ``model``, …) are unwrapped and a prefix shared by every key (``_orig_mod.``,
``module.``) is stripped, and each such step is recorded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert.errors import CorruptFileError, TruncatedFileError, UnsupportedConversionError
from ptconvert.formats import Detection, detect
from ptconvert.formats.checkpoint import describe_contents, read_checkpoint
from ptconvert.formats.hf import weights_file
from ptconvert.formats.safetensors import read_header
from ptconvert.formats.sharded import read_index
from ptconvert.formats.torch_objects import (
    DTYPE_SIZES,
    TensorRef,
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
    path: str  # "fast" (byte copies) or "torch" (loaded with torch.load(weights_only=True))
    metadata: dict[str, str] = field(default_factory=dict)
    unwrapped: str | None = None
    stripped_prefix: str | None = None
    other_contents: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

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
    """Every tensor of a weights file (pt, safetensors, sharded set or HF directory)."""
    d = detect(src)
    if d.format == "hf":
        weights = weights_file(src)
        assert weights is not None
        d = detect(weights)
    if d.format == "safetensors":
        ws = _read_safetensors([d.path])
    elif d.format == "sharded":
        ws = _read_sharded(d)
    elif d.format == "pt":
        ws = _read_checkpoint(d, key, skip_unsupported)
    else:
        raise UnsupportedConversionError(
            f"{d.format} files are programs, not weight files: extracting their weights lands "
            "with the converter graph",
            path=src,
        )
    if not keep_prefix:
        _strip_prefix(ws)
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
            entries.append(WeightEntry(name, e.dtype, e.shape, e.end - e.begin, source))
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


def _read_checkpoint(d: Detection, key: str | None, skip_unsupported: bool) -> WeightSet:
    ckpt = read_checkpoint(d.path, d.layout)
    tree, unwrapped, others = _unwrap(ckpt.tree, key, d.path)
    refs = _tensor_leaves(tree, d.path, skip_unsupported)
    archive = ckpt.archive
    fast = archive is not None and _little_endian(archive)
    entries: list[WeightEntry] = []
    seen: dict[tuple[object, ...], str] = {}
    for name, t in refs.items():
        ident = (t.storage.key, t.offset, t.shape, t.stride)
        if ident in seen:
            entries.append(WeightEntry(name, t.dtype, t.shape, t.nbytes, alias_of=seen[ident]))
            continue
        seen[ident] = name
        member = archive.member(t.storage.key) if archive is not None else None
        if archive is not None and member is None:
            raise CorruptFileError(
                f"tensor {name!r}: storage {t.storage.key} is missing", path=d.path
            )
        if member is not None:
            need = (t.offset + t.numel) * t.itemsize
            if member.size < need:
                raise TruncatedFileError(
                    f"tensor {name!r} needs {need} bytes of storage {member.name}, "
                    f"which holds {member.size}",
                    path=d.path,
                )
        if fast and member is not None and member.compress_type == 0 and t.is_contiguous:
            src = ByteRange(d.path, member.data_offset + t.offset * t.itemsize)
            entries.append(WeightEntry(name, t.dtype, t.shape, t.nbytes, src))
        else:
            fast = False
            entries.append(WeightEntry(name, t.dtype, t.shape, t.nbytes))
    ws = WeightSet(entries, "fast" if fast else "torch", unwrapped=unwrapped, other_contents=others)
    if not fast:
        _load_with_torch(ws, d, key)
    return ws


def _little_endian(archive: Any) -> bool:
    member = next((m for m in archive.members if m.name.endswith("/byteorder")), None)
    return member is None or archive.read(member).strip() == b"little"


def _unwrap(tree: Any, key: str | None, path: Path) -> tuple[Any, str | None, dict[str, str]]:
    """The state dict inside a checkpoint: ``key`` if given, else the first known wrapper."""
    if not isinstance(tree, dict):
        raise UnsupportedConversionError(
            "the checkpoint is not a dict of tensors (a whole pickled object?)",
            path=path,
            hint="whole-module pickles need --trust and the converter graph",
        )
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
            return tree, None, {}
    others = describe_contents({k: v for k, v in tree.items() if k != chosen})
    return tree[chosen], chosen, others


def _is_tensor(value: Any) -> bool:
    return isinstance(value, (TensorRef, UnsupportedTensor)) or type(value).__name__ in (
        "Tensor",
        "Parameter",
    )


def _tensor_leaves(tree: Any, path: Path, skip_unsupported: bool) -> dict[str, TensorRef]:
    out: dict[str, TensorRef] = {}
    for name, t in flatten_tensors(tree).items():
        if isinstance(t, UnsupportedTensor):
            if skip_unsupported:
                continue
            raise UnsupportedConversionError(
                f"tensor {name!r} is a {t.kind} tensor, which safetensors cannot hold",
                path=path,
                hint="pass --skip-unsupported to leave it out (it is then reported)",
            )
        if t.dtype not in DTYPE_SIZES or t.dtype.startswith("q"):
            raise UnsupportedConversionError(f"tensor {name!r} has dtype {t.dtype}", path=path)
        out[name] = t
    return out


def _load_with_torch(ws: WeightSet, d: Detection, key: str | None) -> None:
    """The exact path for what cannot be byte-copied: torch.load with weights_only=True."""
    import torch

    try:
        loaded = torch.load(d.path, map_location="cpu", weights_only=True, mmap=d.layout == "zip")
    except Exception as exc:  # torch raises plain RuntimeError/UnpicklingError here
        raise UnsupportedConversionError(
            f"torch.load(weights_only=True) cannot read this checkpoint ({exc})".splitlines()[0],
            path=d.path,
        ) from None
    tree = loaded[ws.unwrapped] if ws.unwrapped else loaded
    flat = flatten_tensors(tree, is_tensor=lambda v: isinstance(v, torch.Tensor))
    for e in ws.entries:
        e.tensor = flat[e.name]
        e.source = None
    ws.notes.append(f"{d.layout} layout or non-contiguous/compressed data: read with torch.load")


def _strip_prefix(ws: WeightSet) -> None:
    names = [e.name for e in ws.entries]
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
    ws.stripped_prefix = stripped


def as_tensors(ws: WeightSet) -> dict[str, Any]:
    """Torch tensors for every entry, backed by a private mmap of the source (copy-on-write,
    nothing read until used); tied entries are the same tensor."""
    import mmap

    import torch

    maps: dict[Path, mmap.mmap] = {}
    out: dict[str, Any] = {}
    for e in ws.stored:
        if e.tensor is not None:
            out[e.name] = e.tensor
            continue
        assert e.source is not None
        dtype = getattr(torch, e.dtype)
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
