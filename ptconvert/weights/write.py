"""Writing weight sets: safetensors (single or sharded, byte copies in the kernel) and torch zip.

Byte ranges are copied file-to-file with ``os.copy_file_range`` (no pass through Python memory;
``os.sendfile``, then reads and writes in large blocks, where the kernel cannot copy between the
two filesystems); tensors from the torch path are written from their own buffers. Tied entries
are written once and recorded as aliases so that reading back restores them as shared tensors.
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path
from typing import Any

from ptconvert.atomic import ensure_space, open_output
from ptconvert.errors import TruncatedFileError, UnsupportedConversionError, UsageError
from ptconvert.formats.safetensors import TORCH_TO_SAFETENSORS
from ptconvert.weights.read import ALIASES_KEY, WeightEntry, WeightSet

COPY_CHUNK = 1 << 30


def parse_size(text: str) -> int:
    """``5GB``, ``500MB``, ``1GiB`` or a byte count → bytes (decimal units as transformers)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", text.upper())
    if m is None:
        raise UsageError(f"cannot read size {text!r} (use e.g. 5GB, 500MB, 1GiB)")
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
    units |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 10**3, "M": 10**6}
    units |= {"G": 10**9, "T": 10**12}
    return int(float(m.group(1)) * units[m.group(2)])


# copy_file_range cannot copy here: another filesystem (EXDEV; before Linux 5.19 any two),
# one without it (ENOSYS, EOPNOTSUPP), a special file (EINVAL)
_NO_KERNEL_COPY = (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)
BLOCK = 8 << 20  # the read-write fallback's block


def copy_range(src_fd: int, offset: int, dst_fd: int, nbytes: int, source: Path) -> None:
    """Copy ``nbytes`` of ``source`` (open as ``src_fd``) from ``offset`` to the current end of
    ``dst_fd``: in the kernel, on any pair of filesystems."""
    copies = (_copy_file_range, _sendfile, _read_write)
    for i, copy in enumerate(copies):
        try:
            while nbytes > 0:
                n = copy(src_fd, offset, dst_fd, min(nbytes, COPY_CHUNK))
                if n == 0:
                    raise TruncatedFileError(
                        f"the file ended {nbytes} bytes early while its tensor bytes were "
                        "copied (was it changed meanwhile?)",
                        path=source,
                    )
                offset += n
                nbytes -= n
            return
        except OSError as exc:
            if exc.errno not in _NO_KERNEL_COPY or i == len(copies) - 1:
                raise


def _copy_file_range(src_fd: int, offset: int, dst_fd: int, count: int) -> int:
    return os.copy_file_range(src_fd, dst_fd, count, offset)


def _sendfile(src_fd: int, offset: int, dst_fd: int, count: int) -> int:
    return os.sendfile(dst_fd, src_fd, offset, count)


def _read_write(src_fd: int, offset: int, dst_fd: int, count: int) -> int:
    block = os.pread(src_fd, min(count, BLOCK), offset)
    view = memoryview(block)
    while view:
        view = view[os.write(dst_fd, view) :]
    return len(block)


def tensor_bytes(tensor: Any) -> memoryview:
    import torch

    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def write_safetensors_file(
    entries: list[WeightEntry], aliases: dict[str, str], metadata: dict[str, str], out: Path
) -> None:
    header: dict[str, Any] = {}
    meta = {"format": "pt", **metadata}
    if aliases:
        meta[ALIASES_KEY] = json.dumps(aliases, sort_keys=True)
    header["__metadata__"] = meta
    pos = 0
    for e in entries:
        shape = list(e.shape)
        if e.dtype == "float4_e2m1fn_x2" and shape:
            shape[-1] *= 2  # safetensors counts the 4-bit values, torch the bytes holding two
        header[e.name] = {
            "dtype": TORCH_TO_SAFETENSORS[e.dtype],
            "shape": shape,
            "data_offsets": [pos, pos + e.nbytes],
        }
        pos += e.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    ensure_space(out.parent, 8 + len(raw) + pos, out)
    fds: dict[Path, int] = {}
    try:
        with open_output(out) as fh:
            fh.write(len(raw).to_bytes(8, "little") + raw)
            fh.flush()
            for e in entries:
                if e.source is not None:
                    if e.source.path not in fds:
                        fds[e.source.path] = os.open(e.source.path, os.O_RDONLY)
                    fh.flush()  # buffered bytes first: the kernel copy writes at the fd's offset
                    copy_range(
                        fds[e.source.path], e.source.offset, fh.fileno(), e.nbytes, e.source.path
                    )
                    fh.seek(0, os.SEEK_END)  # and the buffered writer learns where that ended
                else:
                    fh.write(tensor_bytes(e.tensor))
    finally:
        for fd in fds.values():
            os.close(fd)


def shard_plan(ws: WeightSet, max_bytes: int | None) -> list[list[WeightEntry]]:
    """Fill shards in key order up to ``max_bytes`` (a bigger tensor gets a shard of its own)."""
    shards: list[list[WeightEntry]] = [[]]
    size = 0
    for e in ws.stored:
        if max_bytes is not None and shards[-1] and size + e.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.nbytes
    return shards


def write_safetensors(
    ws: WeightSet,
    out: Path,
    *,
    max_shard_size: int | None = None,
    metadata: dict[str, str] | None = None,
    stem: str = "model",
) -> list[Path]:
    """Write ``ws`` to ``out``: one file, or (sharded) a directory of shards plus the index."""
    bad = {e.name: e.dtype for e in ws.entries if e.dtype not in TORCH_TO_SAFETENSORS}
    if bad:
        listed = ", ".join(f"{n!r} ({dt})" for n, dt in list(bad.items())[:10])
        raise UnsupportedConversionError(
            f"safetensors cannot hold {len(bad)} of the tensors: {listed}",
            path=ws.origin,
            hint="pass --skip-unsupported to leave them out (they are then reported), "
            "or convert --to pt",
        )
    meta = {**ws.metadata, **(metadata or {})}
    aliases = {e.name: e.alias_of for e in ws.entries if e.alias_of is not None}
    shards = shard_plan(ws, max_shard_size)
    if max_shard_size is None:
        write_safetensors_file(shards[0], aliases, meta, out)
        return [out]
    out.mkdir(parents=True, exist_ok=True)
    written, weight_map = [], {}
    for i, group in enumerate(shards, 1):
        name = f"{stem}-{i:05d}-of-{len(shards):05d}.safetensors"
        group_names = {e.name for e in group}
        group_aliases = {a: t for a, t in aliases.items() if t in group_names}
        write_safetensors_file(group, group_aliases, meta, out / name)
        weight_map.update({e.name: name for e in group})
        written.append(out / name)
    total = sum(e.nbytes for e in ws.stored)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    index_path = out / f"{stem}.safetensors.index.json"
    index_path.write_text(json.dumps(index, indent=2) + "\n")
    return [*written, index_path]
