"""A symbolic pickle machine: it runs the opcodes on placeholders and never imports or calls.

This is the one pickle reader of ptconvert. ``info`` and the weights fast path read tensor names,
shapes, dtypes and storage keys from the tree it builds; the scanner classifies the imports and
calls it records. Nothing here can execute a payload: a global is a ``Global`` record, a call is a
``Call`` record holding its callee and arguments, and a value the machine cannot know (a memo slot
never written, an extension code, an out-of-band buffer) is an ``Unknown`` with the reason.
"""

from __future__ import annotations

import _imp
import codecs
import io
import mmap
import pickletools
import re
import sys
import warnings
from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING
from collections import ChainMap
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

# Resource caps: a hostile pickle must not make the reader allocate without bound.
MAX_OPCODES = 20_000_000
MAX_STACK = 1_000_000


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

    kind: str  # "import" | "call" | "build" | "unknown" | "persid"
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


class _Mark:
    pass


_MARK = _Mark()


def run_pickle(
    data: bytes | mmap.mmap,
    start: int = 0,
    *,
    joblib: bool = False,
    seed: RawRegion | None = None,
    fresh: bool = False,
) -> PickleRun:
    """Run the pickle that begins at ``data[start]`` symbolically, up to its STOP opcode.

    ``data`` may be an mmap, so that a pickle followed by gigabytes of storage bytes (the legacy
    torch layout) is read without copying the file into memory. With ``joblib``, the stream is
    read as ``joblib.load`` reads it: the array bytes written after each of joblib's array
    wrappers are skipped (or, for an object array, run as the nested pickle they are). With
    ``seed``, the bytes of that region are run as a plain unpickler runs them, from its stack and
    memo, up to the region's end (a missing memo slot then fails, as in CPython).

    With ``fresh``, the bytes are run as a new unpickler that ``torch.load`` or ``pickle.load``
    makes for them runs them, failing where it fails: a memo slot never written, an extension
    code, an out-of-band buffer, a name that no import can resolve, a call of a literal. This is
    how the bytes of a file read as something else (a safetensors file, a tar, Python source)
    are read from byte 0: garbage stops where the real unpickler stops, a payload does not.
    """
    stream: Any = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data
    start = seed.start if seed else start
    stream.seek(start)
    stack: list[Any] = list(seed.stack) if seed else []
    metastack: list[list[Any]] = [list(s) for s in seed.metastack] if seed else []
    memo: MutableMapping[int, Any] = seed.memo if seed else {}
    regions: list[PickleRun] = []
    events: list[Event] = []
    protocol = 0
    root: Any = None
    end = start
    count = 0
    arrays = 0

    def pop_mark() -> list[Any]:
        nonlocal stack
        items = stack
        stack = metastack.pop()
        return items

    def unknown(op: str, pos: int, reason: str) -> Unknown:
        if fresh:  # a new unpickler has no memo, extension registry or buffers: it fails here
            raise ValueError(f"{op} at offset {pos}: {reason}")
        value = Unknown(reason, pos)
        events.append(Event("unknown", op, pos, value, reason))
        return value

    try:
        for opcode, raw_arg, pos in _ops(stream):
            arg: Any = raw_arg
            pos = int(pos or 0)
            if seed and pos >= seed.end:
                end = pos
                break  # through the whole region: what follows is judged with the stream
            count += 1
            if count > MAX_OPCODES or len(stack) > MAX_STACK:
                raise ValueError("pickle exceeds the reader's resource limits")
            name = opcode.name
            end = pos + 1
            if name == "PROTO":
                protocol = int(arg)
            elif name == "FRAME":
                pass
            elif name == "STOP":
                if fresh and not stack:
                    raise IndexError("STOP on an empty stack")
                root = stack.pop() if stack else None
                end = stream.tell()
                break
            elif name == "MARK":
                metastack.append(stack)
                stack = []
            elif name in ("POP",):
                if stack:
                    stack.pop()
                else:
                    pop_mark()
            elif name == "POP_MARK":
                pop_mark()
            elif name == "DUP":
                stack.append(stack[-1])
            elif name in ("NONE",):
                stack.append(None)
            elif name in ("NEWTRUE", "NEWFALSE"):
                stack.append(name == "NEWTRUE")
            elif name in (
                "INT",
                "BININT",
                "BININT1",
                "BININT2",
                "LONG",
                "LONG1",
                "LONG4",
                "FLOAT",
                "BINFLOAT",
                "STRING",
                "BINSTRING",
                "SHORT_BINSTRING",
                "UNICODE",
                "SHORT_BINUNICODE",
                "BINUNICODE",
                "BINUNICODE8",
                "BINBYTES",
                "SHORT_BINBYTES",
                "BINBYTES8",
                "BYTEARRAY8",
            ):
                stack.append(arg)
            elif name in ("NEXT_BUFFER",):
                stack.append(unknown(name, pos, "out-of-band buffer"))
            elif name == "READONLY_BUFFER":
                pass
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                items = stack[-n:]
                del stack[-n:]
                stack.append(tuple(items))
            elif name == "TUPLE":
                items = pop_mark()  # rebinds ``stack``: pop before appending
                stack.append(tuple(items))
            elif name == "EMPTY_LIST":
                stack.append([])
            elif name == "LIST":
                items = pop_mark()
                stack.append(items)
            elif name == "EMPTY_DICT":
                stack.append(Dict())
            elif name == "DICT":
                items = pop_mark()
                stack.append(Dict(list(zip(items[::2], items[1::2], strict=False))))
            elif name in ("EMPTY_SET",):
                stack.append([])
            elif name == "FROZENSET":
                items = pop_mark()
                stack.append(items)
            elif name in ("ADDITEMS", "APPENDS"):
                items = pop_mark()
                _extend(stack[-1], items, events, name, pos)
            elif name == "APPEND":
                value = stack.pop()
                _extend(stack[-1], [value], events, name, pos)
            elif name == "SETITEM":
                value = stack.pop()
                key = stack.pop()
                _setitems(stack[-1], [(key, value)], events, name, pos)
            elif name == "SETITEMS":
                items = pop_mark()
                pairs = list(zip(items[::2], items[1::2], strict=False))
                _setitems(stack[-1], pairs, events, name, pos)
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[int(arg)] = stack[-1]
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                key = int(arg)
                if key in memo:
                    stack.append(memo[key])
                elif seed:
                    raise KeyError(f"memo slot {key} was never written")
                else:
                    stack.append(unknown(name, pos, f"memo slot {key} was never written"))
            elif name == "GLOBAL":
                module, attr = arg
                stack.append(_import(events, module, attr, name, pos, protocol, fresh))
            elif name == "STACK_GLOBAL":
                attr_v = stack.pop()
                module_v = stack.pop()
                if isinstance(module_v, str) and isinstance(attr_v, str):
                    stack.append(_import(events, module_v, attr_v, name, pos, protocol, fresh))
                elif fresh and (_literal(module_v) or _literal(attr_v)):
                    raise TypeError("STACK_GLOBAL requires str")
                else:
                    g = Global(
                        module_v if isinstance(module_v, str) else None,
                        attr_v if isinstance(attr_v, str) else None,
                        name,
                        pos,
                        reason="module or name is not a constant string "
                        f"({type(module_v).__name__}, {type(attr_v).__name__})",
                    )
                    events.append(Event("import", name, pos, g, g.reason or ""))
                    stack.append(g)
            elif name == "INST":
                items = pop_mark()  # CPython finds the mark before it reads the names
                module, attr = arg
                cls = _import(events, module, attr, name, pos, protocol, fresh)
                stack.append(_call(events, cls, tuple(items), name, pos))
            elif name == "OBJ":
                items = pop_mark()
                obj_cls = items[0] if items else unknown(name, pos, "OBJ without a class")
                stack.append(_call(events, obj_cls, tuple(items[1:]), name, pos, fresh=fresh))
            elif name == "REDUCE":
                args = stack.pop()
                func = stack.pop()
                stack.append(_call(events, func, args, name, pos, fresh=fresh))
            elif name == "NEWOBJ":
                args = stack.pop()
                cls = stack.pop()
                stack.append(_call(events, cls, args, name, pos, fresh=fresh))
            elif name == "NEWOBJ_EX":
                kwargs = stack.pop()
                args = stack.pop()
                cls = stack.pop()
                stack.append(_call(events, cls, args, name, pos, kwargs, fresh))
            elif name == "BUILD":
                state = stack.pop()
                target = stack[-1]
                events.append(Event("build", name, pos, target, "", state))
                if isinstance(target, Call):
                    target.state = state
                    _set_attributes(target, state)
                if is_joblib_wrapper(target):
                    arrays += 1
                    if joblib:
                        at = stream.tell()
                        stack[-1] = _read_joblib_array(data, stream, target, events)
                        after = stream.tell()
                        if after > at:  # pickle.load runs these bytes, from this context
                            copies = [list(s) for s in metastack]
                            kind = "array" if stack[-1] is target else "object-array"
                            seed_at = RawRegion(
                                at, after, [*stack[:-1], target], copies, ChainMap({}, memo), kind
                            )
                            regions.append(run_pickle(data, seed=seed_at))
                            stream.seek(after)  # an mmap is the stream: the run moved it
            elif name in ("PERSID", "BINPERSID"):
                pid = arg if name == "PERSID" else stack.pop()
                ref = PersistentRef(pid, pos)
                events.append(Event("persid", name, pos, ref))
                stack.append(ref)
            elif name in ("EXT1", "EXT2", "EXT4"):
                value = unknown(name, pos, f"copyreg extension code {arg} (resolves to any global)")
                events.append(
                    Event("import", name, pos, Global(None, None, name, pos, value.reason))
                )
                stack.append(value)
            else:  # an opcode pickletools knows but this machine does not model
                raise ValueError(f"unsupported opcode {name}")
        else:
            raise ValueError("pickle ended without a STOP opcode")
    except (ValueError, IndexError, KeyError, TypeError, EOFError) as exc:
        truncated = stream.read(1) == b""
        error = _describe(exc)
        return PickleRun(
            start, end, None, protocol, events, error, count, truncated, arrays, regions
        )
    region = seed.kind if seed else None
    return PickleRun(
        start, end, root, protocol, events, None, count, False, arrays, regions, region
    )


# torch.save before 1.6 writes five pickles (this magic number, protocol, sys_info, the object,
# the storage keys), then raw storage bytes that must not be read as opcodes.
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PICKLES = 5


def _ops(stream: Any) -> Any:
    """(opcode, argument, offset) like ``pickletools.genops``, but with every argument read as
    CPython's C unpickler (the one ``torch.load`` runs) reads it: ``pickletools`` refuses
    ``I0x10``, ``p0\\0junk`` or a STRING that is not ASCII, which that unpickler accepts, and
    it reads GLOBAL names with escapes undone, which the unpickler does not."""
    while True:
        pos = stream.tell()
        code = stream.read(1)
        if not code:
            raise ValueError("pickle exhausted before seeing STOP")
        op = _CODE2OP.get(code.decode("latin-1"))
        if op is None:
            raise ValueError(f"unknown opcode {code!r} at offset {pos}")
        reader = _C_READERS.get(op.name)
        if reader is not None:
            arg: Any = reader(stream)
        else:
            arg = op.arg.reader(stream) if op.arg is not None else None
        yield op, arg, pos


# A line longer than this, in a mapped file, is not copied whole: what it makes (a name, a string
# value) is judged by its first MiB and its last bytes (a safetensors header read as a string
# runs to the first newline in the tensor data, which may be gigabytes away).
_LONG_LINE = 1 << 20


class _Long(bytes):
    """A line cut to its first ``_LONG_LINE`` bytes and its last 16 (its newline kept)."""


def _readline(stream: Any) -> bytes:
    if not isinstance(stream, mmap.mmap):
        return bytes(stream.readline())
    start = stream.tell()
    end = stream.find(b"\n", start)
    if end < 0:  # no newline: the reader fails, as CPython's does
        stream.seek(0, 2)
        return stream[start : start + _LONG_LINE]
    stream.seek(end + 1)
    if end - start < _LONG_LINE:
        return stream[start : end + 1]
    return _Long(stream[start : start + _LONG_LINE] + stream[end - 16 : end + 1])


def _take(stream: Any, n: int) -> bytes:
    """``n`` bytes, never copied from a mapped file when fewer remain (a length read from
    garbage may claim the whole file)."""
    if n > sys.maxsize or (isinstance(stream, mmap.mmap) and n > len(stream) - stream.tell()):
        raise ValueError(f"expected {n} bytes, more than remain")
    data = stream.read(n)
    if len(data) < n:
        raise ValueError(f"expected {n} bytes, but only {len(data)} remain")
    return bytes(data)


def _text_line(stream: Any, what: str) -> bytes:
    line = _readline(stream)
    if not line.endswith(b"\n"):
        raise ValueError(f"no newline found when trying to read {what}")
    return _Long(line[:-1]) if isinstance(line, _Long) else line[:-1]


def _py2_text(raw: bytes) -> str:
    """A Python 2 string (STRING, BINSTRING, SHORT_BINSTRING) as ``torch.load`` decodes it: its
    unpickler is given ``encoding="utf-8"``. Bytes that are not UTF-8 (torch fails there; an
    unpickler given ``encoding="latin1"`` does not) are read as latin-1, so that the reading goes
    on wherever some unpickler goes on."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _read_string(stream: Any) -> str:
    """STRING (``load_string``): a quoted line, escapes undone as ``PyBytes_DecodeEscape`` does."""
    body = _text_line(stream, "a STRING")
    if len(body) < 2 or body[:1] != body[-1:] or body[:1] not in (b"'", b'"'):
        raise ValueError("the STRING opcode argument must be quoted")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # an invalid escape is kept as is
        try:
            raw = codecs.escape_decode(body[1:-1])[0]
        except ValueError:
            if not isinstance(body, _Long):
                raise
            raw = body[1:-1]  # cut inside an escape: the value is judged by its bytes
    return _py2_text(raw)


def _read_unicode(stream: Any) -> str:
    """UNICODE: a line in raw-unicode-escape (a cut one decoded leniently)."""
    body = _text_line(stream, "a UNICODE string")
    return str(body, "raw-unicode-escape", "replace" if isinstance(body, _Long) else "strict")


def _counted(width: int, kind: str) -> Any:
    """The length-prefixed arguments (little-endian unsigned lengths, as CPython reads them):
    ``kind`` is "py2" (BINSTRING, SHORT_BINSTRING), "str", "bytes" or "bytearray"."""

    def read(stream: Any) -> Any:
        n = int.from_bytes(_take(stream, width), "little")
        data = _take(stream, n)
        if kind == "py2":
            return _py2_text(data)
        if kind == "str":
            return data.decode("utf-8", "surrogatepass")
        return bytearray(data) if kind == "bytearray" else data

    return read


def _read_long4(stream: Any) -> int:
    n = int.from_bytes(_take(stream, 4), "little", signed=True)
    if n < 0:
        raise ValueError("LONG pickle has negative byte count")
    return int.from_bytes(_take(stream, n), "little", signed=True)


def _names(encoding: str) -> Any:
    """GLOBAL (UTF-8) and INST (ASCII): two lines, neither empty, no escapes undone."""

    def read(stream: Any) -> tuple[str, str]:
        module = _text_line(stream, "a module name")
        name = _text_line(stream, "a global name") if module else b""
        if not module or not name:
            raise ValueError("pickle data was truncated (an empty name)")
        return module.decode(encoding), name.decode(encoding)

    return read


def _line(stream: Any) -> bytes:
    line = _readline(stream)
    if not line.endswith(b"\n"):
        raise ValueError("no newline found when trying to read a text number")
    return bytes(line[:-1].split(b"\0", 1)[0])  # C string functions stop at a NUL


def _c_int(text: bytes) -> int | bool:
    """``load_int``: "00"/"01" are booleans, else strtol with base 0 (hex, octal, decimal)."""
    if text in (b"00", b"01"):
        return text == b"01"
    body = text.lstrip(b" \t\n\r\f\v")
    sign = -1 if body[:1] == b"-" else 1
    body = body[1:] if body[:1] in (b"-", b"+") else body
    if body[:2].lower() == b"0x":
        return sign * int(body[2:], 16)
    if body[:1] == b"0" and len(body) > 1:
        return sign * int(body[1:], 8)
    return sign * int(body, 10)


def _c_long(text: bytes) -> int:
    """``load_long``: a trailing L is dropped, then Python's int() with base 0."""
    return int(text[:-1] if text.endswith(b"L") else text, 0)


def _c_float(text: bytes) -> float:
    return float(text)


def _c_decimal(text: bytes) -> int:
    """PUT and GET: ``PyLong_FromString(s, NULL, 10)``, which stops at a NUL like ``_line``."""
    return int(text, 10)


def _text_number(parse: Any) -> Any:
    return lambda stream: parse(_line(stream))


_C_READERS: dict[str, Any] = {
    "INT": _text_number(_c_int),
    "LONG": _text_number(_c_long),
    "FLOAT": _text_number(_c_float),
    "PUT": _text_number(_c_decimal),
    "GET": _text_number(_c_decimal),
    "STRING": _read_string,
    "BINSTRING": _counted(4, "py2"),
    "SHORT_BINSTRING": _counted(1, "py2"),
    "UNICODE": _read_unicode,
    "BINUNICODE": _counted(4, "str"),
    "SHORT_BINUNICODE": _counted(1, "str"),
    "BINUNICODE8": _counted(8, "str"),
    "BINBYTES": _counted(4, "bytes"),
    "SHORT_BINBYTES": _counted(1, "bytes"),
    "BINBYTES8": _counted(8, "bytes"),
    "BYTEARRAY8": _counted(8, "bytearray"),
    "LONG4": _read_long4,
    "GLOBAL": _names("utf-8"),
    "INST": _names("ascii"),
    "PERSID": lambda stream: _text_line(stream, "a persistent id").decode("ascii"),
}
_CODE2OP = {op.code: op for op in pickletools.opcodes}


def acted(run: PickleRun) -> bool:
    """Whether the run reached an opcode that imports, calls, builds or cannot be resolved.

    An unpickler that fails before any of these has run nothing: such bytes are not a pickle.
    """
    return any(e.kind in ("import", "call", "build", "unknown") for e in run.events)


def run_torch_pickles(
    data: bytes | mmap.mmap, start: int = 0, *, fresh: bool = False
) -> list[PickleRun]:
    """Every pickle an unpickler would run in a stream that is not a zip or a tar.

    ``torch.load`` runs the first pickle whatever its framing; when that pickle is the legacy
    magic number (or a value only a call can tell) it runs four more, then reads raw storages.
    Otherwise the stream is read as ``pickle.load`` in a loop would: the following pickles up to
    bytes that fail before doing anything. ``fresh`` is ``run_pickle``'s.
    """
    first = run_pickle(data, start, fresh=fresh)
    runs = [first]
    if first.error:
        return runs
    legacy = first.root == LEGACY_MAGIC or isinstance(first.root, (Call, Unknown, Global))
    pos = first.end
    while pos < len(data) and (not legacy or len(runs) < LEGACY_PICKLES):
        run = run_pickle(data, pos, fresh=fresh)
        if run.error and not legacy and not acted(run):
            break  # not a pickle: a loader stops here without having run anything
        runs.append(run)
        if run.error or run.end <= pos:
            break
        pos = run.end
    return runs


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, IndexError):
        return f"stack underflow ({text})"
    return text


def _import(
    events: list[Event],
    module: str,
    attr: str,
    opcode: str,
    pos: int,
    protocol: int,
    fresh: bool = False,
) -> Global:
    """The global CPython's ``find_class`` would import: protocols 0-2 spell Python 2 names,
    which it maps first by (module, name), then by module. The import system looks frozen
    modules up by a C string, so a module name with a NUL in it imports the frozen module named
    by what comes before the NUL (``os\\0x`` is ``os``), or nothing: it is judged by that name."""
    if protocol < 3 and (module, attr) in NAME_MAPPING:
        module, attr = NAME_MAPPING[(module, attr)]
    else:
        module = IMPORT_MAPPING.get(module, module)
    if "\0" in module:
        module, _, rest = module.partition("\0")
        if fresh and module not in _FROZEN:
            raise ValueError(f"no import resolves {module + chr(0) + rest!r}")
    if fresh and not _resolvable(module, attr):
        raise ValueError(f"no import resolves {module!r}, {attr!r}")
    g = Global(module, attr, opcode, pos)
    events.append(Event("import", opcode, pos, g, ""))
    return g


# Frozen modules: the only ones a name with a NUL in it can import (their finder compares names
# as C strings); the list of this interpreter, and CPython 3.11's in case it cannot be had.
_FROZEN = frozenset(getattr(_imp, "_frozen_module_names", tuple)()) | frozenset(
    {
        *("_collections_abc", "_frozen_importlib", "_frozen_importlib_external", "_sitebuiltins"),
        *("abc", "codecs", "genericpath", "importlib.machinery", "importlib.util", "io"),
        *("ntpath", "os", "os.path", "posixpath", "runpy", "site", "stat", "zipimport"),
    }
)


def _resolvable(module: str, attr: str) -> bool:
    """Whether any import could resolve the name: dotted identifiers (or a name torch's legacy
    ``find_class`` turns into a storage type, whatever the module)."""
    if "\0" in attr:
        return False
    if "Storage" in attr and attr.isidentifier():
        return True
    parts = [*module.split("."), *attr.split(".")]
    return all(p.isidentifier() for p in parts)


# A value of one of these types is what its opcode made: calling it or passing it as the argument
# tuple fails in CPython (``args`` must be a tuple; a literal is not callable).
_LITERALS = (type(None), bool, int, float, str, bytes, bytearray, tuple, list, Dict)


def _literal(value: Any) -> bool:
    return isinstance(value, _LITERALS)


def _call(
    events: list[Event],
    func: Any,
    args: Any,
    opcode: str,
    pos: int,
    kwargs: Any = None,
    fresh: bool = False,
) -> Call:
    if fresh and (_literal(func) or (_literal(args) and not isinstance(args, tuple))):
        raise TypeError(f"{opcode} of a {type(func).__name__} with {type(args).__name__} args")
    call = Call(func, args, opcode, pos, kwargs)
    events.append(Event("call", opcode, pos, call, ""))
    return call


# The methods CPython's unpickler calls to add items to an object that is not a list (APPEND and
# APPENDS call ``extend``, else ``append``; pickle.py's APPEND calls ``append``) or not a set
# (ADDITEMS calls ``add``): looked up on the object, so an instance attribute comes first.
_ITEM_METHODS: dict[str, tuple[str, ...]] = {
    "APPEND": ("extend", "append"),
    "APPENDS": ("extend", "append"),
    "ADDITEMS": ("add",),
}


def _extend(target: Any, items: list[Any], events: list[Event], opcode: str, pos: int) -> None:
    """APPEND(S)/ADDITEMS as CPython does them: ``list.extend``, else the object's own method,
    which a BUILD before may have set on the instance: a call of that value is recorded."""
    if isinstance(target, list):
        target.extend(items)
    elif isinstance(target, Call):
        target.appends.extend(items)
        _method_calls(target, items, events, opcode, pos)
    elif isinstance(target, Global):
        why = f"{opcode} on an imported global calls its own {'/'.join(_ITEM_METHODS[opcode])}"
        events.append(Event("unknown", opcode, pos, Unknown(why, pos), why))
    elif not isinstance(target, Unknown):
        raise TypeError(f"APPEND to a {type(target).__name__}")


def _method_calls(
    target: Call, items: list[Any], events: list[Event], opcode: str, pos: int
) -> None:
    """The calls of the methods a BUILD put in the instance's ``__dict__`` that adding items makes
    (``ns.add = f`` then ADDITEMS runs ``f(item)``)."""
    if target.attrs is None:
        why = f"{opcode} after a BUILD whose state may set the method it calls"
        events.append(Event("unknown", opcode, pos, Unknown(why, pos), why))
        return
    for method in _ITEM_METHODS[opcode]:
        if method not in target.attrs:
            continue
        func = target.attrs[method]
        for args in [(list(items),)] if method == "extend" else [(item,) for item in items]:
            _call(events, func, args, opcode, pos)


def _set_attributes(target: Call, state: Any) -> None:
    """What BUILD puts in the instance's ``__dict__`` (a state and a slot state), accumulated over
    every BUILD; a state that is not a literal mapping leaves the attributes unknown."""
    if target.attrs is None:
        return
    pairs = _state_pairs(state)
    if pairs is None:
        target.attrs = None
        return
    for key, value in pairs:
        if isinstance(key, str):
            target.attrs[key] = value
        elif not _literal(key):  # a key only a call computes: any name
            target.attrs = None
            return


_MAPPING_CALLS = frozenset({"builtins.dict", "collections.OrderedDict"})


def _state_pairs(state: Any) -> list[tuple[Any, Any]] | None:
    if state is None:
        return []
    if isinstance(state, Dict):
        return list(state.items)
    if isinstance(state, tuple) and len(state) == 2:  # (state, slotstate)
        first, second = _state_pairs(state[0]), _state_pairs(state[1])
        return None if first is None or second is None else first + second
    if not isinstance(state, Call) or _dotted(state.func) not in _MAPPING_CALLS:
        return None
    pairs = list(state.items)
    for arg in state.args if isinstance(state.args, tuple) else (state.args,):
        if isinstance(arg, Dict):
            pairs += arg.items
        elif isinstance(arg, (list, tuple)) and all(
            isinstance(p, tuple) and len(p) == 2 for p in arg
        ):
            pairs += arg
        else:
            return None
    return pairs


def _setitems(
    target: Any, items: list[tuple[Any, Any]], events: list[Event], opcode: str, pos: int
) -> None:
    """SETITEM(S) as CPython does them: ``obj[key] = value`` on whatever is below the mark."""
    if isinstance(target, Global):
        why = f"{opcode} on an imported global calls its own __setitem__"
        events.append(Event("unknown", opcode, pos, Unknown(why, pos), why))
    elif isinstance(target, (Dict, Call)):
        target.items.extend(items)
    elif isinstance(target, list):
        # list.__setitem__: an int index in range or a slice works, as in CPython; a constant of
        # any other type fails there; a computed key (a slice() call) changes what we cannot know
        for key, value in items:
            if isinstance(key, int) and -len(target) <= key < len(target):
                target[key] = value
            elif isinstance(key, (int, str, bytes, float, type(None), Dict, list, tuple)):
                raise IndexError(f"SETITEM on a list with key {key!r} at offset {pos}")
    elif not isinstance(target, Unknown):
        raise TypeError(f"SETITEM on a {type(target).__name__} at offset {pos}")


# joblib.dump writes each numpy array as this wrapper, then the array's bytes right after the
# wrapper's BUILD, outside the pickle's opcodes; joblib.load reads them there (numpy_pickle.py).
JOBLIB_WRAPPER = "joblib.numpy_pickle.NumpyArrayWrapper"


def is_joblib_wrapper(value: Any) -> bool:
    """Whether ``value`` builds joblib's array wrapper (NEWOBJ, or copyreg at protocols 0-1)."""
    if not isinstance(value, Call):
        return False
    cls = value.func
    if _dotted(cls) == "copyreg._reconstructor" and isinstance(value.args, tuple) and value.args:
        cls = value.args[0]
    return _dotted(cls) == JOBLIB_WRAPPER


def _dotted(value: Any) -> str | None:
    return f"{value.module}.{value.name}" if isinstance(value, Global) else None


def _read_joblib_array(data: Any, stream: Any, wrapper: Call, events: list[Event]) -> Any:
    """Move ``stream`` past the array bytes that follow a wrapper, as joblib's read_array does;
    an object array is a nested pickle, run here (its events are this run's). What the stack
    holds in the wrapper's place is returned: the wrapper, or the nested pickle's root."""
    has_object, nbytes, padded = joblib_array_layout(wrapper.state)
    pos = stream.tell()
    if has_object:
        nested = run_pickle(data, pos)  # joblib reads it with a fresh plain Unpickler
        events.extend(nested.events)
        if nested.error:
            raise ValueError(f"joblib object array at offset {pos}: {nested.error}")
        stream.seek(nested.end)
        return nested.root
    if padded:
        pad = bytes(data[pos : pos + 1])
        if not pad:
            raise EOFError("joblib array padding past the end of the stream")
        pos += 1 + pad[0]
    if pos + nbytes > len(data):
        raise EOFError(f"joblib array of {nbytes} bytes runs past the end of the stream")
    stream.seek(pos + nbytes)
    return wrapper


_DTYPE_SPEC = re.compile(r"[A-Za-z?]\d*")


def joblib_array_layout(state: Any) -> tuple[bool, int, bool]:
    """(object array, bytes of data, padding byte first) from a wrapper's BUILD state, or
    ValueError where the layout depends on something the machine cannot know."""
    if not isinstance(state, Dict) or not all(isinstance(k, str) for k, _ in state.items):
        raise ValueError("joblib array wrapper without a literal state")
    fields = dict(state.items)
    shape = fields.get("shape")
    if not isinstance(shape, tuple) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise ValueError(f"joblib array shape is not literal ({shape!r:.60})")
    count = 1
    for n in shape:
        count *= n
    has_object, itemsize = _joblib_dtype(fields.get("dtype"))
    align = fields.get("numpy_array_alignment_bytes")
    return has_object, count * itemsize, align is not None


def _joblib_dtype(value: Any) -> tuple[bool, int]:
    """(has objects, item size) of a pickled ``numpy.dtype(spec, False, True)`` with its BUILD
    state ``(version, order, subarray, names, fields, elsize, ...)``; structured dtypes refused."""
    import numpy as np

    args = value.args if isinstance(value, Call) else None
    state = value.state if isinstance(value, Call) else None
    if (
        _dotted(value.func if isinstance(value, Call) else None) != "numpy.dtype"
        or not isinstance(args, tuple)
        or not args
        or not isinstance(args[0], str)
        or not _DTYPE_SPEC.fullmatch(args[0])
    ):
        raise ValueError("joblib array dtype is not a literal numpy dtype")
    if isinstance(state, tuple) and len(state) >= 6 and (state[2] is not None or state[3]):
        raise ValueError("joblib array with a structured dtype: its layout is not checked")
    try:
        base = np.dtype(args[0])
    except TypeError as exc:
        raise ValueError(f"joblib array dtype {args[0]!r}: {exc}") from None
    elsize = state[5] if isinstance(state, tuple) and len(state) >= 6 else -1
    if base.kind in "VSU" and isinstance(elsize, int) and elsize > 0:
        return base.hasobject, elsize  # flexible types take their size from the state
    if elsize not in (-1, base.itemsize):
        raise ValueError(f"joblib array dtype {args[0]!r} with item size {elsize!r}")
    return base.hasobject, base.itemsize
