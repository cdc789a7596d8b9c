"""What the opcodes that reach beyond the stack do, as CPython's unpickler does it: the global
``find_class`` imports, a call, items added to an object, the attributes BUILD sets. Each is
recorded as an ``Event`` (never performed), and fails where a fresh unpickler fails.

The machine (``machine.py``) dispatches the opcodes; these are the effects the scanner judges,
kept apart so that each rule (Python 2 names, a NUL in a module name, an instance's own ``add``)
sits beside its reason.
"""

from __future__ import annotations

import _imp
from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING
from typing import Any

from ptconvert.pickles.records import Call, Dict, Event, Global, Unknown, brief, dotted


def import_global(
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


def is_literal(value: Any) -> bool:
    return isinstance(value, _LITERALS)


def record_call(
    events: list[Event],
    func: Any,
    args: Any,
    opcode: str,
    pos: int,
    kwargs: Any = None,
    fresh: bool = False,
) -> Call:
    if fresh and (is_literal(func) or (is_literal(args) and not isinstance(args, tuple))):
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


def add_items(target: Any, items: list[Any], events: list[Event], opcode: str, pos: int) -> None:
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
            record_call(events, func, args, opcode, pos)


def set_attributes(target: Call, state: Any) -> None:
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
        elif not is_literal(key):  # a key only a call computes: any name
            target.attrs = None
            return


_MAPPING_CALLS = frozenset({"builtins.dict", "collections.OrderedDict"})


def _state_pairs(state: Any, pair: bool = True) -> list[tuple[Any, Any]] | None:
    if state is None:
        return []
    if isinstance(state, Dict):
        return list(state.items)
    if pair and isinstance(state, tuple) and len(state) == 2:  # (state, slotstate): one level
        first, second = _state_pairs(state[0], False), _state_pairs(state[1], False)
        return None if first is None or second is None else first + second
    if not isinstance(state, Call) or dotted(state.func) not in _MAPPING_CALLS:
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


def set_items(
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
                raise IndexError(f"SETITEM on a list with key {brief(key)} at offset {pos}")
    elif not isinstance(target, Unknown):
        raise TypeError(f"SETITEM on a {type(target).__name__} at offset {pos}")
