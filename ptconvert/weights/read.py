"""Reading weights from any weights-holding format into one flat list of entries.

The format of the file says how (``Format.read_weights``: a byte range of the file for each
tensor whose bytes can be copied as they are, a torch tensor rebuilt from the storage bytes
otherwise); a directory reads the file its format names (``Format.weights_file``). Here the
reading is dispatched, a format whose reading runs its own loader is scanned first, and a prefix
shared by every key (``_orig_mod.``, ``module.``) is stripped, and recorded. A file without
tensors is a NoWeightsError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ptconvert.errors import NoWeightsError, UnsupportedConversionError
from ptconvert.formats import FORMATS, detect
from ptconvert.formats.weightset import WeightSet

STRIPPED_PREFIXES = ("_orig_mod.", "module.")


def read_weights(
    src: Path,
    *,
    key: str | None = None,
    keep_prefix: bool = False,
    skip_unsupported: bool = False,
) -> WeightSet:
    """Every tensor of a weights file (pt, safetensors, sharded set, HF directory, …) or of a
    program (TorchScript, pt2: its parameters and buffers, named as its state dict names them)."""
    d = detect(src)
    inner = d.handler.weights_file(d.path)
    if inner is not None:  # a directory: its weights file (or shard index) is read
        d = detect(inner)
    fmt = d.handler
    if not fmt.reads_weights:
        raise UnsupportedConversionError(
            f"ptconvert cannot read the weights of {d.format} files", path=src
        )
    if fmt.loads_to_read(d.path, d.layout):
        from ptconvert.scan.guard import guard

        guard(d.path)  # its own loader runs only on a file the scan finds clean
    ws = fmt.read_weights(d.path, d.layout, key, skip_unsupported)
    ws.origin, ws.format, ws.layout = d.path, d.format, d.layout
    if not ws.entries:
        left = f" once the {len(ws.skipped)} unsupported ones are left out" if ws.skipped else ""
        raise NoWeightsError(f"the file holds no tensors{left}", path=src)
    if not keep_prefix:
        _strip_prefix(ws)
    return ws


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


def weight_sources() -> set[str]:
    """The formats whose weights can be read (directories of them included)."""
    return {f.name for f in FORMATS if f.reads_weights}
