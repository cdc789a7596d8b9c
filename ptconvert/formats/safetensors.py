"""safetensors: an 8-byte little-endian header length, a JSON header, then raw tensor bytes —
read (byte ranges), read again independently for the check (``safe_open`` and the header's
offsets), written (one file or shards and their index, byte ranges copied in the kernel).

The header is read and bounds-checked here (no safetensors or torch import), so that ``info`` is
fast and a hostile header length cannot make us allocate gigabytes.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import struct
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert.atomic import ensure_space, open_output
from ptconvert.errors import (
    CorruptFileError,
    TruncatedFileError,
    UnsupportedConversionError,
    UsageError,
)
from ptconvert.formats.base import FileInfo, Format, Probe, file_entry
from ptconvert.formats.byte_copy import copy_range, tensor_bytes
from ptconvert.formats.reference import Ref, Reference, file_range
from ptconvert.formats.weightset import ALIASES_KEY, ByteRange, WeightEntry, WeightSet

# The safetensors library refuses headers above 100 MB; so do we, before allocating.
MAX_HEADER = 100_000_000

# safetensors dtype code → (torch dtype name, bits per element)
DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 64),
    "F32": ("float32", 32),
    "F16": ("float16", 16),
    "BF16": ("bfloat16", 16),
    "I64": ("int64", 64),
    "I32": ("int32", 32),
    "I16": ("int16", 16),
    "I8": ("int8", 8),
    "U64": ("uint64", 64),
    "U32": ("uint32", 32),
    "U16": ("uint16", 16),
    "U8": ("uint8", 8),
    "BOOL": ("bool", 8),
    "F8_E4M3": ("float8_e4m3fn", 8),
    "F8_E5M2": ("float8_e5m2", 8),
    "F8_E8M0": ("float8_e8m0fnu", 8),
    "C64": ("complex64", 64),
    "F4": ("float4_e2m1fn_x2", 4),
}
TORCH_TO_SAFETENSORS: dict[str, str] = {t: code for code, (t, _) in DTYPES.items()}


@dataclass(frozen=True)
class HeaderEntry:
    dtype: str  # torch dtype name
    shape: tuple[int, ...]
    begin: int  # byte offsets relative to the start of the data section
    end: int


@dataclass
class SafetensorsHeader:
    header_len: int
    tensors: dict[str, HeaderEntry]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def data_start(self) -> int:
        return 8 + self.header_len


def read_header(path: Path) -> SafetensorsHeader:
    """Read and validate a safetensors header: lengths, dtypes, shapes and non-overlapping spans."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        prefix = fh.read(8)
        if len(prefix) < 8:
            raise TruncatedFileError(
                "safetensors file is shorter than its 8-byte header length", path=path
            )
        (n,) = struct.unpack("<Q", prefix)
        if n > MAX_HEADER:
            raise CorruptFileError(
                f"safetensors header length is {n} bytes, above the {MAX_HEADER}-byte limit: "
                "the file is corrupt or not safetensors",
                path=path,
            )
        if 8 + n > size:
            raise TruncatedFileError(
                f"safetensors header length ({n} bytes) runs past the end of the file "
                f"({size} bytes): the file is truncated or corrupt",
                path=path,
            )
        raw = os.pread(fh.fileno(), n, 8)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptFileError(f"safetensors header is not valid JSON ({exc})", path=path) from None
    if not isinstance(header, dict):
        raise CorruptFileError("safetensors header is not a JSON object", path=path)
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise CorruptFileError("safetensors __metadata__ is not an object", path=path)
    data_len = size - 8 - n
    tensors: dict[str, HeaderEntry] = {}
    for name, spec in header.items():
        tensors[name] = _entry(path, name, spec, data_len)
    spans = sorted((e.begin, e.end, k) for k, e in tensors.items() if e.end > e.begin)
    for (_, end_a, a), (begin_b, _, b) in itertools.pairwise(spans):
        if begin_b < end_a:
            raise CorruptFileError(
                f"safetensors tensors {a!r} and {b!r} overlap in the data section", path=path
            )
    return SafetensorsHeader(n, tensors, {str(k): str(v) for k, v in metadata.items()})


def _entry(path: Path, name: str, spec: Any, data_len: int) -> HeaderEntry:
    try:
        code = spec["dtype"]
        shape = tuple(int(s) for s in spec["shape"])
        begin, end = (int(x) for x in spec["data_offsets"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptFileError(
            f"safetensors entry {name!r} is malformed ({exc})", path=path
        ) from None
    if code not in DTYPES:
        raise CorruptFileError(f"tensor {name!r} has unknown dtype {code!r}", path=path)
    dtype, bits = DTYPES[code]
    nbytes = (math.prod(shape) * bits + 7) // 8
    if any(s < 0 for s in shape) or begin < 0 or end - begin != nbytes:
        raise CorruptFileError(
            f"tensor {name!r}: data_offsets [{begin}, {end}] do not hold {shape} of {code}",
            path=path,
        )
    if end > data_len:
        raise TruncatedFileError(
            f"tensor {name!r} ends at byte {end} of a {data_len}-byte data section "
            "(the file is truncated)",
            path=path,
        )
    return HeaderEntry(dtype, shape, begin, end)


def read_safetensors(paths: list[Path]) -> WeightSet:
    """The tensors of safetensors files (one, or a sharded set's shards): each a byte range of
    its file, tied names (our aliases metadata) as aliases."""
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


def _header(path: Path) -> tuple[dict[str, Any], int]:
    """The safetensors header of ``path`` (8-byte little-endian length, then JSON) and where its
    data begins."""
    with open(path, "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(size))
    return header, 8 + size


def safetensors_reference(paths: list[Path], stack: ExitStack) -> Reference:
    """safetensors' own ``safe_open`` validates each file and names every tensor's dtype and
    shape; the bytes are read at the offsets of the file's header, parsed here (not by
    ``read_safetensors``), and must agree with what ``safe_open`` says. No tensor is built: no
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
            dtype, bits = DTYPES.get(code, (code.lower(), 8))
            if dtype == "float4_e2m1fn_x2" and shape:
                shape = (*shape[:-1], shape[-1] // 2)
            nbytes = (math.prod(shape) * bits + 7) // 8
            if stop - begin != nbytes:
                problems.append(f"{name}: {stop - begin} bytes stored for {nbytes}")
                continue
            at = data_start + begin
            tensors[name] = Ref(dtype, shape, nbytes, file_range(fd, at, nbytes), (path, at))
        aliases = json.loads(metadata.get(ALIASES_KEY, "{}"))
        for alias, target in aliases.items():
            if target in tensors:
                tensors[alias] = tensors[target]
    return Reference("safetensors.safe_open + the header's offsets", tensors, problems)


def parse_size(text: str) -> int:
    """``5GB``, ``500MB``, ``1GiB`` or a byte count → bytes (decimal units as transformers)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", text.upper())
    if m is None:
        raise UsageError(f"cannot read size {text!r} (use e.g. 5GB, 500MB, 1GiB)")
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
    units |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 10**3, "M": 10**6}
    units |= {"G": 10**9, "T": 10**12}
    return int(float(m.group(1)) * units[m.group(2)])


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
    # the data section starts 64-byte aligned (safetensors' own writer pads to 8 with spaces): a
    # tensor copied from here into a torch zip keeps its offset there (torch_zip.LIKE_SOURCE)
    raw += b" " * (-(8 + len(raw)) % 64)
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


class SafetensorsFormat(Format):
    name = "safetensors"
    suffixes = (".safetensors",)
    holds = "weights (name → tensor), string metadata; no code"
    priority = 10

    read_label = "read tensors"
    write_label = "write safetensors"
    writes_shards = True
    folder_file = "model.safetensors"
    reference_without_torch = True  # safe_open and the header's offsets: no tensor built

    def read_weights(
        self, path: Path, layout: str, key: str | None, skip_unsupported: bool
    ) -> WeightSet:
        return read_safetensors([path])

    def reference(self, ws: WeightSet, may_load: Callable[[], bool], stack: ExitStack) -> Reference:
        assert ws.origin is not None
        return safetensors_reference([ws.origin], stack)

    def write_weights(
        self,
        ws: WeightSet,
        out: Path,
        *,
        max_shard_size: int | None = None,
        metadata: dict[str, str] | None = None,
    ) -> list[Path]:
        return write_safetensors(ws, out, max_shard_size=max_shard_size, metadata=metadata)

    def holds_dtype(self, dtype: str) -> bool:
        return dtype in TORCH_TO_SAFETENSORS

    def holds_no_pickle(self, head: bytes, path: Path) -> bool:
        if len(head) >= 9 and head[5:8] == b"\0\0\0" and head[8:9] == b"{":
            read_header(path)  # raises InputError for a broken header: reported as unreadable
            return True
        return False

    def match(self, probe: Probe) -> str | None:
        head = probe.head
        # u64 header length whose high bytes are zero, then the JSON object's opening brace
        if len(head) >= 9 and head[5:8] == b"\0\0\0" and head[8:9] == b"{":
            return "single"
        return None

    def info(self, path: Path, layout: str) -> FileInfo:
        header = read_header(path)
        info = FileInfo(str(path), self.name, layout, path.stat().st_size, [file_entry(path)])
        info.add_tensors(
            (k, e.dtype, list(e.shape), math.prod(e.shape)) for k, e in header.tensors.items()
        )
        info.metadata = header.metadata
        return info
