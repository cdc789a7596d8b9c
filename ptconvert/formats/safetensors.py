"""safetensors: an 8-byte little-endian header length, a JSON header, then raw tensor bytes.

The header is read and bounds-checked here (no safetensors or torch import), so that ``info`` is
fast and a hostile header length cannot make us allocate gigabytes.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert.errors import CorruptFileError, TruncatedFileError
from ptconvert.formats.base import FileInfo, Format, Probe, file_entry

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


class SafetensorsFormat(Format):
    name = "safetensors"
    suffixes = (".safetensors",)
    holds = "weights (name → tensor), string metadata; no code"
    priority = 10

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
