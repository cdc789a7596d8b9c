"""The GGUF file itself (llama.cpp's format): a header (magic ``GGUF``, version, typed key-value
metadata, tensor infos) and an aligned data section of tensors, quantized blocks included.

The header is parsed here with bounds checks (no gguf, numpy or torch import): ``info``,
``scan`` and the copy of F32/F16/BF16/F64/integer tensors as byte ranges need nothing else.
GGUF lists dims innermost first: the torch shape is that list reversed. Its tensors under their
own names (``plain_weights``): plain types as byte ranges, quantized blocks (Q4_0, Q8_0, Q4_K, …)
dequantized into float32 by the gguf package's own ``gguf.quants.dequantize`` (the ``gguf``
extra), checked against the gguf package's ``GGUFReader``.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import mmap
import struct
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ptconvert.deps import require
from ptconvert.errors import (
    CorruptFileError,
    TruncatedFileError,
    UnsupportedConversionError,
)

if TYPE_CHECKING:
    from ptconvert.formats.reference import Ref, Reference
    from ptconvert.formats.weightset import WeightSet

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # v1 (2023) counted in 32 bits; llama.cpp reads v2 and v3
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32
SHORT_ARRAY = 16  # longer arrays (a tokenizer's vocabulary) are kept as their length only

# ggml type id → (name as GGUF names it, elements per block, bytes per block, torch dtype of a
# type copied as it is; "" for quantized blocks). gguf.constants.GGML_QUANT_SIZES, by value.
GGML_TYPES: dict[int, tuple[str, int, int, str]] = {
    0: ("F32", 1, 4, "float32"),
    1: ("F16", 1, 2, "float16"),
    2: ("Q4_0", 32, 18, ""),
    3: ("Q4_1", 32, 20, ""),
    6: ("Q5_0", 32, 22, ""),
    7: ("Q5_1", 32, 24, ""),
    8: ("Q8_0", 32, 34, ""),
    9: ("Q8_1", 32, 40, ""),
    10: ("Q2_K", 256, 84, ""),
    11: ("Q3_K", 256, 110, ""),
    12: ("Q4_K", 256, 144, ""),
    13: ("Q5_K", 256, 176, ""),
    14: ("Q6_K", 256, 210, ""),
    15: ("Q8_K", 256, 292, ""),
    16: ("IQ2_XXS", 256, 66, ""),
    17: ("IQ2_XS", 256, 74, ""),
    18: ("IQ3_XXS", 256, 98, ""),
    19: ("IQ1_S", 256, 50, ""),
    20: ("IQ4_NL", 32, 18, ""),
    21: ("IQ3_S", 256, 110, ""),
    22: ("IQ2_S", 256, 82, ""),
    23: ("IQ4_XS", 256, 136, ""),
    24: ("I8", 1, 1, "int8"),
    25: ("I16", 1, 2, "int16"),
    26: ("I32", 1, 4, "int32"),
    27: ("I64", 1, 8, "int64"),
    28: ("F64", 1, 8, "float64"),
    29: ("IQ1_M", 256, 56, ""),
    30: ("BF16", 1, 2, "bfloat16"),
    34: ("TQ1_0", 256, 54, ""),
    35: ("TQ2_0", 256, 66, ""),
    39: ("MXFP4", 32, 17, ""),
    40: ("NVFP4", 64, 36, ""),
    41: ("Q1_0", 128, 18, ""),
}

# general.file_type: llama.cpp's llama_ftype (gguf.LlamaFileType)
FILE_TYPES: dict[int, str] = {
    0: "ALL_F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 3: "MOSTLY_Q4_1", 7: "MOSTLY_Q8_0",
    8: "MOSTLY_Q5_0", 9: "MOSTLY_Q5_1", 10: "MOSTLY_Q2_K", 11: "MOSTLY_Q3_K_S",
    12: "MOSTLY_Q3_K_M", 13: "MOSTLY_Q3_K_L", 14: "MOSTLY_Q4_K_S", 15: "MOSTLY_Q4_K_M",
    16: "MOSTLY_Q5_K_S", 17: "MOSTLY_Q5_K_M", 18: "MOSTLY_Q6_K", 19: "MOSTLY_IQ2_XXS",
    20: "MOSTLY_IQ2_XS", 21: "MOSTLY_Q2_K_S", 22: "MOSTLY_IQ3_XS", 23: "MOSTLY_IQ3_XXS",
    24: "MOSTLY_IQ1_S", 25: "MOSTLY_IQ4_NL", 26: "MOSTLY_IQ3_S", 27: "MOSTLY_IQ3_M",
    28: "MOSTLY_IQ2_S", 29: "MOSTLY_IQ2_M", 30: "MOSTLY_IQ4_XS", 31: "MOSTLY_IQ1_M",
    32: "MOSTLY_BF16", 36: "MOSTLY_TQ1_0", 37: "MOSTLY_TQ2_0", 38: "MOSTLY_MXFP4_MOE",
    39: "MOSTLY_NVFP4", 40: "MOSTLY_Q1_0", 1024: "GUESSED",
}  # fmt: skip

# metadata value types: struct format of the fixed-size ones; 8 is a string, 9 an array
VALUE_TYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
               "string", "array", "uint64", "int64", "float64")  # fmt: skip
_SCALARS = dict(zip((0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12), "BbHhIif?Qqd", strict=True))


@dataclass(frozen=True)
class LongArray:
    """A metadata array longer than SHORT_ARRAY, kept as its item type and length."""

    item: str
    length: int

    def __str__(self) -> str:
        return f"<array of {self.length:,} {self.item}>"


@dataclass(frozen=True)
class GgufTensor:
    name: str
    ggml_type: int
    shape: tuple[int, ...]  # torch order: GGUF's dims reversed
    offset: int  # in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]

    @property
    def dtype(self) -> str:
        """The torch dtype its bytes are, "" for quantized blocks."""
        return GGML_TYPES[self.ggml_type][3]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def label(self) -> str:
        """How ``info`` names its type: torch's dtype, or GGUF's name for quantized blocks."""
        return self.dtype or self.type_name


@dataclass
class GgufHeader:
    version: int
    metadata: dict[str, Any]  # arrays longer than SHORT_ARRAY as LongArray
    value_types: dict[str, str]
    tensors: list[GgufTensor]
    alignment: int
    data_start: int

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def quantized(self) -> list[GgufTensor]:
        return [t for t in self.tensors if not t.dtype]

    def scalars(self) -> dict[str, str]:
        """The scalar metadata as strings (safetensors metadata): text as it is, others JSON."""
        return {
            k: v if isinstance(v, str) else json.dumps(v)
            for k, v in self.metadata.items()
            if isinstance(v, (str, int, float, bool))
        }


def read_header(path: Path) -> GgufHeader:
    """Parse and validate a GGUF header: counts, strings and arrays within the file, tensor
    shapes, types, alignment and data spans (inside the file, not overlapping)."""
    size = path.stat().st_size
    if size < 24:
        raise TruncatedFileError(f"a {size}-byte file cannot hold a GGUF header", path=path)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return _Parser(buf, path).header()


@functools.lru_cache(maxsize=8)
def _cached_header(path: Path, stamp: tuple[int, int]) -> GgufHeader:
    return read_header(path)


def header_of(path: Path) -> GgufHeader:
    """``read_header``, parsed once per file state (detection, reading and the check share it)."""
    st = path.stat()
    return _cached_header(path.resolve(), (st.st_size, st.st_mtime_ns))


class _Parser:
    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.path, self.pos, self.size = buf, path, 0, len(buf)

    def _need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise TruncatedFileError(
                f"the GGUF header ends inside {what} (byte {self.pos:,} of {self.size:,}, "
                f"{n:,} more needed): the file is truncated or corrupt",
                path=self.path,
            )

    def _unpack(self, code: str, what: str) -> Any:
        width = struct.calcsize("<" + code)
        self._need(width, what)
        (value,) = struct.unpack_from("<" + code, self.buf, self.pos)
        self.pos += width
        return value

    def _string(self, what: str, *, strict: bool = False, keep: bool = True) -> str:
        n = self._unpack("Q", what)
        self._need(n, what)
        raw, self.pos = self.buf[self.pos : self.pos + n] if keep else b"", self.pos + n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            if strict:
                raise CorruptFileError(f"{what} is not UTF-8 text", path=self.path) from None
            return raw.decode("utf-8", "replace")

    def _value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if vtype in _SCALARS:
            return self._unpack(_SCALARS[vtype], what)
        if vtype == 8:
            return self._string(what)
        if vtype != 9 or depth > 2:
            raise CorruptFileError(f"{what} has an unknown value type ({vtype})", path=self.path)
        item = self._unpack("I", what)
        count = self._unpack("Q", what)
        code = _SCALARS.get(item)
        if code is not None:
            width = struct.calcsize("<" + code) * count
            self._need(width, what)
            if count > SHORT_ARRAY:
                self.pos += width
                return LongArray(VALUE_TYPES[item], count)
            values = list(struct.unpack_from(f"<{count}{code}", self.buf, self.pos))
            self.pos += width
            return values
        if item not in (8, 9):
            raise CorruptFileError(f"{what} holds an unknown value type ({item})", path=self.path)
        self._need(count * 8, what)  # every string or array takes 8 bytes at least
        if count <= SHORT_ARRAY:
            return [self._value(item, what, depth + 1) for _ in range(count)]
        for _ in range(count):  # walked, not kept
            if item == 8:
                self._string(what, keep=False)
            else:
                self._value(item, what, depth + 1)
        return LongArray(VALUE_TYPES[item], count)

    def header(self) -> GgufHeader:
        path = self.path
        if self.buf[:4] != MAGIC:
            raise CorruptFileError("not a GGUF file (no GGUF magic)", path=path)
        self.pos = 4
        version = self._unpack("I", "the version")
        if version not in VERSIONS:
            raise _version_error(version, path)
        n_tensors = self._unpack("Q", "the tensor count")
        n_kv = self._unpack("Q", "the metadata count")
        if n_tensors * 24 + n_kv * 13 > self.size:  # the smallest tensor info and entry
            raise TruncatedFileError(
                f"the header claims {n_tensors:,} tensors and {n_kv:,} metadata entries, more "
                f"than a {self.size:,}-byte file can hold: the file is truncated or corrupt",
                path=path,
            )
        metadata: dict[str, Any] = {}
        types: dict[str, str] = {}
        for i in range(n_kv):
            key = self._string(f"metadata key {i}", strict=True)
            if key in metadata:
                raise CorruptFileError(f"metadata key {key!r} appears twice", path=path)
            vtype = self._unpack("I", f"metadata {key!r}")
            metadata[key] = self._value(vtype, f"metadata {key!r}")
            types[key] = VALUE_TYPES[vtype]
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if types.get("general.alignment", "uint32") != "uint32" or not (
            alignment > 0 and alignment & (alignment - 1) == 0
        ):
            raise CorruptFileError(f"general.alignment {alignment!r} is no power of 2", path=path)
        infos = [self._tensor_info(i) for i in range(n_tensors)]
        data_start = -(-self.pos // alignment) * alignment
        tensors = [self._placed(info, data_start, alignment) for info in infos]
        names = Counter(t.name for t in tensors)
        if len(names) < len(tensors):
            twice = [n for n, c in names.items() if c > 1]
            raise CorruptFileError(f"tensor names appear twice: {twice[:5]}", path=path)
        spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors if t.nbytes)
        for (_, end_a, a), (begin_b, _, b) in itertools.pairwise(spans):
            if begin_b < end_a:
                raise CorruptFileError(f"tensors {a!r} and {b!r} overlap", path=path)
        return GgufHeader(version, metadata, types, tensors, alignment, data_start)

    def _tensor_info(self, i: int) -> tuple[str, list[int], int, int]:
        name = self._string(f"the name of tensor {i}", strict=True)
        what = f"tensor {name!r}"
        n_dims = self._unpack("I", what)
        if n_dims > MAX_DIMS:
            raise CorruptFileError(f"{what} has {n_dims} dims, past {MAX_DIMS}", path=self.path)
        dims = [self._unpack("Q", what) for _ in range(n_dims)]
        return name, dims, self._unpack("I", what), self._unpack("Q", what)

    def _placed(self, info: tuple[str, list[int], int, int], start: int, align: int) -> GgufTensor:
        name, dims, ggml_type, offset = info
        if ggml_type not in GGML_TYPES:
            raise UnsupportedConversionError(
                f"tensor {name!r} has ggml type {ggml_type}, which ptconvert does not know "
                "(written by a newer llama.cpp?)",
                path=self.path,
            )
        type_name, block, type_size, _ = GGML_TYPES[ggml_type]
        if dims and dims[0] % block:
            raise CorruptFileError(
                f"tensor {name!r}: {dims[0]} elements per row do not fill {type_name} blocks of "
                f"{block}",
                path=self.path,
            )
        nbytes = math.prod(dims) // block * type_size
        if offset % align:
            raise CorruptFileError(
                f"tensor {name!r} starts at offset {offset}, not a multiple of the alignment "
                f"({align})",
                path=self.path,
            )
        if start + offset + nbytes > self.size:
            raise TruncatedFileError(
                f"tensor {name!r} ends at byte {start + offset + nbytes:,} of a "
                f"{self.size:,}-byte file: the file is truncated",
                path=self.path,
            )
        return GgufTensor(name, ggml_type, tuple(reversed(dims)), start + offset, nbytes)


def _version_error(version: int, path: Path) -> Exception:
    swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
    if swapped in (1, *VERSIONS):
        return UnsupportedConversionError(
            f"a big-endian GGUF (v{swapped}): ptconvert reads little-endian GGUF files only",
            path=path,
            hint="convert the model again without --bigendian",
        )
    if version == 1:
        return UnsupportedConversionError(
            "GGUF version 1 (2023): llama.cpp reads versions 2 and 3 only", path=path
        )
    return CorruptFileError(f"unknown GGUF version {version}", path=path)


def dequantized(path: Path, t: GgufTensor) -> Any:
    """A quantized tensor as float32 (a torch tensor), by the gguf package's own dequantize."""
    gguf = require("gguf")
    import numpy as np
    import torch

    rows = np.fromfile(path, dtype=np.uint8, count=t.nbytes, offset=t.offset)
    _, block, type_size, _ = GGML_TYPES[t.ggml_type]
    rows = rows.reshape(-1, t.shape[-1] // block * type_size) if t.shape else rows
    try:
        values = gguf.quants.dequantize(rows, gguf.GGMLQuantizationType(t.ggml_type))
    except NotImplementedError as exc:
        raise UnsupportedConversionError(
            f"tensor {t.name!r}: the gguf package cannot dequantize {t.type_name} ({exc})",
            path=path,
            hint="pass --skip-unsupported to leave it out (it is then reported)",
        ) from None
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32).reshape(t.shape))


def summary(types: Counter[str]) -> str:
    return ", ".join(f"{name} ({n})" for name, n in sorted(types.items()))


def plain_weights(path: Path, header: GgufHeader, skip_unsupported: bool) -> WeightSet:
    """Every tensor under its GGUF name: plain types as byte ranges, quantized ones dequantized
    into float32; the scalar metadata as safetensors metadata."""
    from ptconvert.formats.weightset import ByteRange, WeightEntry, WeightSet

    entries: list[WeightEntry] = []
    skipped: dict[str, str] = {}
    done: Counter[str] = Counter()
    for t in header.tensors:
        if t.dtype:
            entries.append(
                WeightEntry(t.name, t.dtype, t.shape, t.nbytes, ByteRange(path, t.offset))
            )
            continue
        try:
            tensor = dequantized(path, t)
        except UnsupportedConversionError as exc:
            if not skip_unsupported:
                raise
            skipped[t.name] = exc.message
            continue
        entries.append(WeightEntry(t.name, "float32", t.shape, t.numel * 4, tensor=tensor))
        done[t.type_name] += 1
    ws = WeightSet(entries, "torch" if done else "fast", header.scalars(), skipped=skipped)
    copied = len(entries) - sum(done.values())
    ws.notes.append(f"{copied} tensors copied as byte ranges of the file")
    if done:
        ws.notes.append(
            f"dequantized {sum(done.values())} tensors of types {summary(done)} into float32 "
            "(gguf.quants.dequantize)"
        )
    return ws


def gguf_reader_reference(path: Path) -> Reference:
    """The gguf package's GGUFReader: its tensors' bytes as they are for plain types, its
    ``dequantize`` for quantized blocks; shapes its dims reversed. No torch."""
    from ptconvert.formats.reference import Reference

    gguf = require("gguf", "pass --no-verify to convert without the check (its reader is gguf's)")
    reader = gguf.GGUFReader(path)
    quantized = {gguf.GGMLQuantizationType(i) for i, v in GGML_TYPES.items() if not v[3]}
    tensors = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        name = gguf.GGMLQuantizationType(t.tensor_type).name
        if t.tensor_type in quantized:
            tensors[t.name] = array_ref(
                "float32", shape, gguf.quants.dequantize, t.data, t.tensor_type
            )
        else:
            dtype = next(v[3] for v in GGML_TYPES.values() if v[0] == name)
            tensors[t.name] = array_ref(dtype, shape, lambda data: data, t.data)
    return Reference("gguf.GGUFReader (+ gguf.quants.dequantize)", tensors)


def array_ref(dtype: str, shape: tuple[int, ...], make: Callable[..., Any], *args: Any) -> Ref:
    """A Ref over the numpy array ``make(*args)`` builds when the check reaches it."""
    import numpy as np

    from ptconvert.formats.reference import CHUNK, Ref

    itemsize = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "int8": 1}.get(dtype, 2)
    nbytes = math.prod(shape) * itemsize

    def chunks() -> Iterator[memoryview]:
        data = np.ascontiguousarray(make(*args)).reshape(-1).view(np.uint8).data
        for pos in range(0, len(data), CHUNK):
            yield data[pos : pos + CHUNK]

    return Ref(dtype, shape, nbytes, chunks)
