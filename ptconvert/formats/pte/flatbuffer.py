"""The flatbuffer of an ExecuTorch program (``.pte``), read here with the layout of
ExecuTorch's ``program.fbs`` (no executorch import, nothing run): each method's inputs and
outputs (dtypes, and sizes: the upper bounds where a dim is dynamic, as ExecuTorch plans memory
for them), its input names from the pytree spec the exporter stores, the backends its delegate
calls go to, the operators left to the portable kernels, a constant method's values, and the
bytes of constants, delegate payloads and planned memory. ``formats/pte.py`` describes the file
from it, ``formats/isolated.py`` feeds ExecuTorch's runtime the inputs by these names.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert.errors import CorruptFileError

IDENTIFIER = re.compile(rb"ET\d\d")
_EXTENDED_MAGIC = b"eh00"  # the extended header after the identifier: sizes of the segments

# program.fbs's ScalarType → torch dtype name
SCALAR_TYPES: dict[int, str] = {
    0: "uint8",
    1: "int8",
    2: "int16",
    3: "int32",
    4: "int64",
    5: "float16",
    6: "float32",
    7: "float64",
    11: "bool",
    12: "qint8",
    13: "quint8",
    14: "qint32",
    15: "bfloat16",
    16: "quint4x2",
    17: "quint2x4",
    22: "bits16",
    23: "float8_e5m2",
    24: "float8_e4m3fn",
    25: "float8_e5m2fnuz",
    26: "float8_e4m3fnuz",
    27: "uint16",
    28: "uint32",
    29: "uint64",
}
_ITEM_BYTES = {
    "uint8": 1,
    "int8": 1,
    "bool": 1,
    "qint8": 1,
    "quint8": 1,
    "quint4x2": 1,
    "quint2x4": 1,
    "int16": 2,
    "float16": 2,
    "bfloat16": 2,
    "bits16": 2,
    "uint16": 2,
    "int32": 4,
    "float32": 4,
    "qint32": 4,
    "uint32": 4,
    "int64": 8,
    "float64": 8,
    "uint64": 8,
}
_TENSOR = 5  # KernelTypes: the union tag of a Tensor value
_KERNEL_CALL, _DELEGATE_CALL = 1, 2  # InstructionArguments tags
_DYNAMISM = {0: "static", 1: "dynamic, bounded", 2: "dynamic, unbounded"}


class _Table:
    """One flatbuffer table: fields by their index in the schema (a union takes two: its type,
    then its value). Every offset is checked against the buffer (a bad file: CorruptFileError)."""

    def __init__(self, buf: bytes, pos: int, path: Path) -> None:
        self.buf, self.pos, self.path = buf, pos, path
        vtable = pos - self._i32(pos)
        self._vlen = self._u16(vtable)
        self._vtable = vtable

    def _bad(self, what: str) -> CorruptFileError:
        return CorruptFileError(f"not a valid ExecuTorch program ({what})", path=self.path)

    def _unpack(self, fmt: str, at: int) -> Any:
        if at < 0 or at + struct.calcsize(fmt) > len(self.buf):
            raise self._bad(f"an offset points outside the flatbuffer: {at}")
        return struct.unpack_from(fmt, self.buf, at)[0]

    def _i32(self, at: int) -> int:
        return int(self._unpack("<i", at))

    def _u16(self, at: int) -> int:
        return int(self._unpack("<H", at))

    def _field(self, index: int) -> int | None:
        slot = 4 + 2 * index
        if slot >= self._vlen:
            return None
        offset = self._u16(self._vtable + slot)
        return self.pos + offset if offset else None

    def scalar(self, index: int, fmt: str, default: int | float = 0) -> Any:
        at = self._field(index)
        return default if at is None else self._unpack(fmt, at)

    def _target(self, index: int) -> int | None:
        at = self._field(index)
        return None if at is None else at + int(self._unpack("<I", at))

    def table(self, index: int) -> _Table | None:
        at = self._target(index)
        return None if at is None else _Table(self.buf, at, self.path)

    def string(self, index: int) -> str | None:
        at = self._target(index)
        if at is None:
            return None
        n = int(self._unpack("<I", at))
        if at + 4 + n > len(self.buf):
            raise self._bad("a string runs past the flatbuffer")
        return self.buf[at + 4 : at + 4 + n].decode("utf-8", "replace")

    def _vector(self, index: int, item: int) -> tuple[int, int]:
        at = self._target(index)
        if at is None:
            return 0, 0
        n = int(self._unpack("<I", at))
        if at + 4 + n * item > len(self.buf):
            raise self._bad("a vector runs past the flatbuffer")
        return at + 4, n

    def scalars(self, index: int, fmt: str) -> list[Any]:
        size = struct.calcsize(fmt)
        start, n = self._vector(index, size)
        return list(struct.unpack_from(f"<{n}{fmt}", self.buf, start)) if n else []

    def vector_length(self, index: int) -> int:
        return self._vector(index, 1)[1]

    def tables(self, index: int) -> list[_Table]:
        start, n = self._vector(index, 4)
        return [
            _Table(self.buf, at + int(self._unpack("<I", at)), self.path)
            for at in range(start, start + 4 * n, 4)
        ]


@dataclass
class PteTensor:
    dtype: str
    sizes: list[int]  # the upper bounds of a dynamic tensor
    dynamism: str
    constant: bool  # its data is in the file
    name: str | None = None  # a constant's or a mutable buffer's fully qualified name

    @property
    def nbytes(self) -> int:
        return math.prod(self.sizes) * _ITEM_BYTES.get(self.dtype, 0)


@dataclass
class PteMethod:
    name: str
    inputs: list[PteTensor | str]  # a tensor, or the kind of a non-tensor value
    outputs: list[PteTensor | str]
    input_names: list[str] | None  # from the exporter's pytree spec; None: positional
    output_names: list[str] | None
    delegates: dict[str, int]  # backend id → delegate calls
    portable_ops: dict[str, int]  # operator → kernel calls (the ops no backend took)
    instructions: int
    planned_bytes: int  # memory ExecuTorch plans for the method's values (the maximum sizes)
    constants: list[PteTensor] = field(default_factory=list)
    # a constant method's values (no inputs, every output a literal: get_max_seq_len …)
    returns: list[int | float | bool] | None = None


@dataclass
class PteProgram:
    version: int
    methods: list[PteMethod]
    segment_bytes: dict[str, int]  # constants / delegate payloads / named data / mutable data
    named_data: int  # entries (XNNPACK's weights go there)
    inline_delegate_bytes: int


def _spec_names(text: str | None) -> list[str] | None:
    """The keyword names a pytree spec (torch's ``treespec_dumps``) gives the flat values: a
    call ``(args, kwargs)`` whose args are empty, or a dict of outputs. None otherwise."""
    if not text:
        return None
    try:
        spec = json.loads(text)[1]
        if spec.get("type") == "builtins.tuple" and len(spec["children_spec"]) == 2:
            args, kwargs = spec["children_spec"]
            if args["children_spec"]:
                return None
            spec = kwargs
        if spec.get("type") != "builtins.dict":
            return None
        names = json.loads(spec["context"])
        leaves = all(c.get("type") is None for c in spec["children_spec"])
        return [str(n) for n in names] if leaves else None
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


def _value(values: list[_Table], index: int) -> PteTensor | str:
    if not 0 <= index < len(values):
        return "?"
    kind = values[index].scalar(0, "<B")
    inner = values[index].table(1)
    if kind != _TENSOR or inner is None:
        names = {1: "none", 2: "int", 3: "bool", 4: "float", 6: "str", 7: "int list"}
        return names.get(kind, f"value kind {kind}")
    return _tensor(inner)


_LITERALS = {2: "<q", 3: "<?", 4: "<d"}  # Int, Bool, Double: their one field


def _literal(values: list[_Table], index: int) -> int | float | bool | None:
    """The value of an Int, Bool or Double EValue; None for anything else."""
    if not 0 <= index < len(values):
        return None
    fmt = _LITERALS.get(values[index].scalar(0, "<B"))
    inner = values[index].table(1)
    if fmt is None or inner is None:
        return None
    value: int | float | bool = inner.scalar(0, fmt, False if fmt == "<?" else 0)
    return value


def _tensor(t: _Table) -> PteTensor:
    extra = t.table(9)
    return PteTensor(
        SCALAR_TYPES.get(t.scalar(0, "<b"), f"scalar type {t.scalar(0, '<b')}"),
        [int(s) for s in t.scalars(2, "i")],
        _DYNAMISM.get(t.scalar(8, "<b"), "?"),
        # data in the file and no place in planned memory (a mutable buffer's initial state
        # is data in the file too, copied into its planned place)
        t.scalar(5, "<I") > 0 and t.table(6) is None,
        extra.string(1) if extra is not None else None,
    )


def read_program(path: Path) -> PteProgram:
    """The program's methods, delegates, kernels and data sizes, read from the flatbuffer."""
    with open(path, "rb") as fh:
        head = fh.read(64)
        size = _flatbuffer_size(head, path)
        fh.seek(0)
        buf = fh.read(size)
    if len(buf) < 8 or not IDENTIFIER.fullmatch(buf[4:8]):
        raise CorruptFileError("not an ExecuTorch program (no ET file identifier)", path=path)
    root = _Table(buf, int(struct.unpack_from("<I", buf, 0)[0]), path)
    segments = [(s.scalar(0, "<Q"), s.scalar(1, "<Q")) for s in root.tables(4)]

    def segment_size(index: int) -> int:
        return int(segments[index][1]) if 0 <= index < len(segments) else 0

    sizes: Counter[str] = Counter()
    constant = root.table(5)
    if constant is not None and constant.vector_length(1):
        sizes["constants"] += segment_size(constant.scalar(0, "<I"))
    sizes["constants"] += sum(b.vector_length(0) for b in root.tables(2))
    for mutable in root.tables(6):
        sizes["mutable data"] += segment_size(mutable.scalar(0, "<I"))
    named = root.tables(7)
    named_segments = {n.scalar(1, "<I") for n in named}
    sizes["named data"] += sum(segment_size(i) for i in named_segments)
    inline = sum(d.vector_length(0) for d in root.tables(3))
    methods = []
    for plan in root.tables(1):
        methods.append(_method(plan, segment_size, sizes))
    return PteProgram(
        int(root.scalar(0, "<I")),
        methods,
        {k: v for k, v in sizes.items() if v},
        len(named),
        inline,
    )


def _method(plan: _Table, segment_size: Any, sizes: Counter[str]) -> PteMethod:
    values = plan.tables(2)
    meta = plan.table(1)
    ops = [
        f"{o.string(0) or '?'}" + (f".{o.string(1)}" if o.string(1) else "") for o in plan.tables(6)
    ]
    delegates = plan.tables(7)
    for d in delegates:
        ref = d.table(1)
        if ref is not None and ref.scalar(0, "<B") == 1:  # SEGMENT
            sizes["delegate payloads"] += segment_size(ref.scalar(1, "<I"))
    kernels: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    instructions = 0
    for chain in plan.tables(5):
        for ins in chain.tables(2):
            instructions += 1
            kind, args = ins.scalar(0, "<B"), ins.table(1)
            if args is None:
                continue
            index = args.scalar(0, "<i")
            if kind == _KERNEL_CALL and 0 <= index < len(ops):
                kernels[ops[index]] += 1
            elif kind == _DELEGATE_CALL and 0 <= index < len(delegates):
                calls[delegates[index].string(0) or "?"] += 1
    constants = []
    for v in values:
        inner = v.table(1)
        if v.scalar(0, "<B") == _TENSOR and inner is not None:
            tensor = _tensor(inner)
            if tensor.constant:
                constants.append(tensor)
    inputs, outputs = plan.scalars(3, "i"), plan.scalars(4, "i")
    literals = [_literal(values, i) for i in outputs]
    returns = None if inputs or not outputs or None in literals else literals
    return PteMethod(
        plan.string(0) or "?",
        [_value(values, i) for i in inputs],
        [_value(values, i) for i in outputs],
        _spec_names(meta.string(0) if meta is not None else None),
        _spec_names(meta.string(1) if meta is not None else None),
        dict(calls),
        dict(kernels.most_common()),
        instructions,
        sum(int(s) for s in plan.scalars(8, "q")),
        constants,
        [v for v in literals if v is not None] if returns is not None else None,
    )


def _flatbuffer_size(head: bytes, path: Path) -> int:
    """The flatbuffer's own bytes (the segments follow it): the extended header says how many;
    a file without one is all flatbuffer."""
    if len(head) >= 24 and head[8:12] == _EXTENDED_MAGIC:
        size = int.from_bytes(head[16:24], "little")
        if size >= 8 and size <= path.stat().st_size:
            return size
        raise CorruptFileError(
            f"not a valid ExecuTorch program (its header says the program is {size} bytes, "
            f"the file {path.stat().st_size})",
            path=path,
        )
    return path.stat().st_size


def forward_of(program: PteProgram) -> PteMethod:
    """The method a program is called by: ``forward``, else its first."""
    return next((m for m in program.methods if m.name == "forward"), program.methods[0])
