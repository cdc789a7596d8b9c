"""A symbolic pickle machine: it runs the opcodes on placeholders and never imports or calls.

This is the one pickle reader of ptconvert. ``info`` and the weights fast path read tensor names,
shapes, dtypes and storage keys from the tree it builds; the scanner classifies the imports and
calls it records. Nothing here can execute a payload: a global is a ``Global`` record, a call is a
``Call`` record holding its callee and arguments, and a value the machine cannot know (a memo slot
never written, an extension code, an out-of-band buffer) is an ``Unknown`` with the reason.

Here: the opcode loop (the stack, the memo, the marks) and joblib's array bytes skipped or run.
The opcodes' arguments are read in ``opcodes.py``, the records built in ``records.py``, imports,
calls and what adding items or BUILD does in ``effects.py``, the layout of joblib's arrays in
``joblib_arrays.py``, and torch's framing of a stream of pickles in ``torch_streams.py``.
"""

from __future__ import annotations

import io
import mmap
from collections import ChainMap
from collections.abc import MutableMapping
from typing import Any

from ptconvert.pickles.effects import (
    add_items,
    import_global,
    is_literal,
    record_call,
    set_attributes,
    set_items,
)
from ptconvert.pickles.joblib_arrays import is_joblib_wrapper, joblib_array_layout
from ptconvert.pickles.opcodes import read_ops
from ptconvert.pickles.records import (
    Call,
    Dict,
    Event,
    Global,
    PersistentRef,
    PickleRun,
    RawRegion,
    Unknown,
)

# Resource caps: a hostile pickle must not make the reader allocate without bound.
MAX_OPCODES = 20_000_000
MAX_STACK = 1_000_000
# Values in a tuple, each tuple it holds counted once per reference: a tuple holding another
# twice, 40 deep, is 2**40 values that ``hash`` (a dict key, a set item) visits in any unpickler.
MAX_TUPLE_VALUES = 1_000_000


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
    # the sizes of the tuples that hold tuples, with each tuple (so that its id stays its own)
    nested: dict[int, tuple[tuple[Any, ...], int]] = {}
    too_big = False

    def make_tuple(items: list[Any], op: str, pos: int) -> tuple[Any, ...]:
        nonlocal too_big
        value = tuple(items)
        inner = [
            nested[id(v)][1] if id(v) in nested else 1 + len(v) for v in value if type(v) is tuple
        ]
        if inner:  # capped: a size that doubles at each level would grow without bound
            size = min(1 + len(value) - len(inner) + sum(inner), MAX_TUPLE_VALUES + 1)
            nested[id(value)] = (value, size)
            if size > MAX_TUPLE_VALUES and not too_big:  # said once; the reading goes on
                too_big = True
                why = f"a tuple of over {MAX_TUPLE_VALUES:,} values (tuples shared by reference)"
                events.append(Event("limit", op, pos, None, why))
        return value

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
        for opcode, raw_arg, pos in read_ops(stream):
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
                stack.append(make_tuple(items, name, pos))
            elif name == "TUPLE":
                items = pop_mark()  # rebinds ``stack``: pop before appending
                stack.append(make_tuple(items, name, pos))
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
                add_items(stack[-1], items, events, name, pos)
            elif name == "APPEND":
                value = stack.pop()
                add_items(stack[-1], [value], events, name, pos)
            elif name == "SETITEM":
                value = stack.pop()
                key = stack.pop()
                set_items(stack[-1], [(key, value)], events, name, pos)
            elif name == "SETITEMS":
                items = pop_mark()
                pairs = list(zip(items[::2], items[1::2], strict=False))
                set_items(stack[-1], pairs, events, name, pos)
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
                stack.append(import_global(events, module, attr, name, pos, protocol, fresh))
            elif name == "STACK_GLOBAL":
                attr_v = stack.pop()
                module_v = stack.pop()
                if isinstance(module_v, str) and isinstance(attr_v, str):
                    stack.append(
                        import_global(events, module_v, attr_v, name, pos, protocol, fresh)
                    )
                elif fresh and (is_literal(module_v) or is_literal(attr_v)):
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
                cls = import_global(events, module, attr, name, pos, protocol, fresh)
                stack.append(record_call(events, cls, tuple(items), name, pos))
            elif name == "OBJ":
                items = pop_mark()
                obj_cls = items[0] if items else unknown(name, pos, "OBJ without a class")
                stack.append(record_call(events, obj_cls, tuple(items[1:]), name, pos, fresh=fresh))
            elif name == "REDUCE":
                args = stack.pop()
                func = stack.pop()
                stack.append(record_call(events, func, args, name, pos, fresh=fresh))
            elif name == "NEWOBJ":
                args = stack.pop()
                cls = stack.pop()
                stack.append(record_call(events, cls, args, name, pos, fresh=fresh))
            elif name == "NEWOBJ_EX":
                kwargs = stack.pop()
                args = stack.pop()
                cls = stack.pop()
                stack.append(record_call(events, cls, args, name, pos, kwargs, fresh))
            elif name == "BUILD":
                state = stack.pop()
                target = stack[-1]
                events.append(Event("build", name, pos, target, "", state))
                if isinstance(target, Call):
                    target.state = state
                    set_attributes(target, state)
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


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, IndexError):
        return f"stack underflow ({text})"
    return text


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
