"""What the symbolic pickle machine builds and records: its placeholders (``Global``, ``Call``,
``PersistentRef``, ``Unknown``, ``Dict``), the events the scanner judges, and a run's outcome.

Plain data, apart from the machine that makes them (``machine.py``): the formats read tensors from
these trees and the scanner judges these events, neither needing the machine's opcode loop.
"""

from __future__ import annotations

import builtins
import reprlib
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Global:
    """An import the pickle asks for (GLOBAL, STACK_GLOBAL, INST, or an unresolvable one)."""

    module: str | None
    name: str | None
    opcode: str
    offset: int
    reason: str | None = None  # set when module/name are not constant strings

    @property
    def dotted(self) -> str:
        return f"{self.module or '?'}.{self.name or '?'}"


@dataclass
class Call:
    """A call the pickle would make: REDUCE, NEWOBJ(_EX), OBJ or INST."""

    func: Any
    args: Any
    opcode: str
    offset: int
    kwargs: Any = None
    state: Any = None  # what BUILD would pass to __setstate__
    items: list[tuple[Any, Any]] = field(default_factory=list)  # SETITEM(S) on the result
    appends: list[Any] = field(default_factory=list)  # APPEND(S) on the result
    # attributes every BUILD so far put in the instance's __dict__ (None: a state that is not a
    # literal mapping, so any attribute may have been set)
    attrs: dict[str, Any] | None = field(default_factory=dict)


@dataclass(frozen=True)
class PersistentRef:
    pid: Any
    offset: int


@dataclass(frozen=True)
class Unknown:
    reason: str
    offset: int


@dataclass
class Dict:
    """A pickled dict; keys may be unhashable placeholders, so the items stay a list."""

    items: list[tuple[Any, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Event:
    """Something the scanner must judge: an import, a call, a BUILD, or an unknowable value."""

    kind: str  # "import" | "call" | "build" | "unknown" | "persid" | "limit" (a value too large)
    opcode: str
    offset: int
    target: Any = None
    detail: str = ""
    state: Any = None  # BUILD: the state passed to the target


@dataclass
class PickleRun:
    """The outcome of running one pickle stream."""

    start: int
    end: int  # offset just past STOP (or where parsing stopped)
    root: Any
    protocol: int
    events: list[Event]
    error: str | None = None
    opcodes: int = 0
    truncated: bool = False  # the error came from running out of bytes
    joblib_arrays: int = 0  # BUILDs on joblib's array wrapper (raw array bytes follow each)
    # joblib: how pickle.load runs each stretch of array bytes that joblib.load skips
    as_opcodes: list[PickleRun] = field(default_factory=list)
    region: str | None = None  # a run of such a region: its RawRegion.kind

    @property
    def imports(self) -> list[Global]:
        return [e.target for e in self.events if e.kind == "import"]


@dataclass
class RawRegion:
    """Array bytes ``joblib.load`` skips, which ``pickle.load`` and ``torch.load`` run as opcodes,
    with the stack and memo the unpickler has when it reaches them."""

    start: int
    end: int
    stack: list[Any]
    metastack: list[list[Any]]
    memo: MutableMapping[int, Any]  # a view: what the region writes stays its own
    kind: str = "array"  # "array": raw bytes; "object-array": the pickle joblib nests there


def dotted(value: Any) -> str | None:
    """``module.name`` of a ``Global``; None for anything else."""
    return f"{value.module}.{value.name}" if isinstance(value, Global) else None


# Containers inside containers that the readers follow: past this depth a walk stops and says so
# (a pickle nests 100,000 lists in 200 KB; a recursive walk would hit Python's recursion limit).
MAX_NESTING = 100
# Ints wider than this are shown by their width: Python refuses to print more than 4,300 digits.
MAX_INT_BITS = 4096


class _Brief(reprlib.Repr):
    """``reprlib`` over pickled values: a few levels and items of each container, so that
    values shared exponentially or nested past the recursion limit print in bounded work."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxstring, self.maxlong, self.maxother = 4, 100, 100, 100
        self.maxtuple = self.maxlist = self.maxdict = 10

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > MAX_INT_BITS:
            return f"<int of {x.bit_length()} bits>"
        return super().repr_int(x, level)

    def repr_bytes(self, x: bytes, level: int) -> str:
        cut = self.fillvalue if len(x) > self.maxstring else ""
        return builtins.repr(x[: self.maxstring]) + cut

    def repr_Dict(self, x: Dict, level: int) -> str:  # reprlib looks methods up by type name
        return "Dict(" + self.repr_list(x.items, level) + ")"

    def repr_Call(self, x: Call, level: int) -> str:
        return f"{dotted(x.func) or 'call'}{self.repr1(x.args, level - 1)}"

    def repr_PersistentRef(self, x: PersistentRef, level: int) -> str:
        return f"PersistentRef({self.repr1(x.pid, level - 1)})"


_BRIEF = _Brief()


def brief(value: Any, limit: int | None = 80) -> str:
    """``repr(value)`` in bounded work, cut to ``limit`` characters: what a message shows of a
    pickled value (``repr`` itself may never end, overflow the stack or refuse a long int)."""
    return _BRIEF.repr(value)[:limit]
