"""The unpickler of a trusted load: it rebuilds the classes it is given by the default mechanism
and calls nothing else a pickle names.

It is the standard library's own unpickler (``pickle._Unpickler``, the Python one) with every
opcode that calls or imports replaced:

- a global is looked up in the table the caller built (``names``: the allowlist's harmless
  values and the classes trust admits), never imported;
- NEWOBJ and OBJ/INST make an admitted class's instance with ``object.__new__`` (or a builtin
  base's ``__new__``: a dict, list or tuple subclass, a named tuple); the class's own ``__new__``
  and ``__init__`` never run;
- REDUCE calls only the allowlist's callables (torch's tensor rebuilds, ``OrderedDict``, …,
  with torch's and copyreg's class-taking ones checked for the class they get) or an admitted
  Enum with its value; calling an admitted class with the pickle's arguments is refused;
- BUILD sets an admitted instance's state by ``__dict__`` update and slot stores, or by torch's
  own ``__setstate__`` (``nn.Module``'s); SETITEMS, APPENDS and ADDITEMS go to builtin
  containers and to classes whose methods for them are the default ones;
- EXT1/2/4 (copyreg's extension registry) are refused.

A class whose rebuild would run its own code (``scan/admission.py``) gets that code run only
when the user named it with ``--allow`` (``own_code_allowed``): then NEWOBJ calls its
``__new__``, REDUCE calls it and BUILD its ``__setstate__``, as ``pickle`` would. ``Refused`` is
raised for everything else, naming the global and the opcode.

torch.load takes this module as its ``pickle_module`` (``load`` and ``Unpickler``): torch's
container handling (zip, legacy, tar; storages by persistent id) is unchanged.
"""

from __future__ import annotations

import copyreg
import enum
import pickle
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, ClassVar


class Refused(pickle.UnpicklingError):
    """What the trusted load will not do, with the global it concerns (None: none)."""

    def __init__(self, message: str, global_name: str | None = None) -> None:
        super().__init__(message)
        self.global_name = global_name


class Rebuilding:
    """What a load may resolve and call. ``names``: dotted name → value (the only globals the
    pickle may name); ``admitted``: classes rebuilt by the default mechanism; ``own_code_allowed``:
    classes whose own code may run (``--allow``); ``callables``: values REDUCE may call;
    ``checked``: callables that take a class as an argument, each with its check."""

    current: ClassVar[str | None] = None  # the class being rebuilt now (for the audit hook)

    def __init__(
        self,
        names: dict[str, Any],
        admitted: set[type],
        own_code_allowed: set[type],
        callables: set[int],
        stand_ins: set[int] | None = None,
        hashable: set[type] | None = None,
    ) -> None:
        self.stand_ins = stand_ins or set()
        self.hashable = hashable or set()  # admitted classes whose __hash__/__eq__ are default
        self.names = names
        self.admitted = admitted
        self.own_code_allowed = own_code_allowed
        self.callables = callables
        self.names_of = {id(v): k for k, v in names.items()}
        self.checked: dict[int, Callable[..., Any]] = {
            id(copyreg._reconstructor): self._reconstructor,  # type: ignore[attr-defined]
        }
        import torch

        self.checked[id(torch._tensor._rebuild_from_type_v2)] = self._rebuild_from_type
        import collections

        self.checked[id(collections.defaultdict)] = self._defaultdict
        for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
            value = names.get(f"{module}._reconstruct")
            if value is not None:
                self.checked[id(value)] = self._numpy_reconstruct
        self.checked[id(torch._utils._rebuild_wrapper_subclass)] = self._rebuild_wrapper_subclass

    def name(self, value: Any) -> str:
        return self.names_of.get(id(value), getattr(value, "__qualname__", type(value).__name__))

    def is_class(self, value: Any) -> bool:
        return isinstance(value, type) and (
            value in self.admitted or value in self.own_code_allowed
        )

    # -- making instances ------------------------------------------------------------------

    def new(self, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any], op: str) -> Any:
        if isinstance(cls, type) and cls in self.own_code_allowed:
            return self._running(cls, lambda: cls.__new__(cls, *args, **kwargs))
        if not isinstance(cls, type) or (cls not in self.admitted and not self._safe_type(cls)):
            raise Refused(f"{op} makes an instance of {self.name(cls)}, which is not admitted")
        if self._safe_type(cls):  # an allowlisted type (OrderedDict, a datetime, …)
            self.plain((args, kwargs), f"{op} of {self.name(cls)}")
            return cls.__new__(cls, *args, **kwargs)
        base = _builtin_base(cls)
        if base is object:
            if args or kwargs:
                raise Refused(
                    f"{op} passes arguments to {self.name(cls)}'s constructor, which rebuilding "
                    "by the default mechanism does not take",
                    self.name(cls),
                )
            return object.__new__(cls)
        if base is tuple and is_named_tuple(cls):
            return tuple.__new__(cls, args)
        return base.__new__(cls, *args, **kwargs)

    def call(self, func: Any, args: tuple[Any, ...]) -> Any:
        if isinstance(func, type) and func in self.own_code_allowed:
            return self._running(func, lambda: func(*args))
        check = self.checked.get(id(func))
        if check is not None:
            return check(func, *args)
        if id(func) in self.callables and id(func) not in _NEVER_CALLED:
            self.plain(args, f"REDUCE of {self.name(func)}")
            return func(*args)
        if isinstance(func, type) and func in self.admitted:
            if issubclass(func, enum.Enum) and len(args) == 1:
                self.plain(args, f"REDUCE of {self.name(func)}")
                return func(args[0])  # a member by its value: Enum's own lookup
            raise Refused(
                f"REDUCE calls {self.name(func)} with the pickle's arguments: that runs its "
                "__init__, which trust does not admit (it admits rebuilding, not calling)",
                self.name(func),
            )
        raise Refused(f"REDUCE calls {self.name(func)}, which the trusted load does not call")

    def _safe_type(self, cls: type) -> bool:
        return id(cls) in self.callables

    def plain(self, value: Any, where: str) -> None:
        """Refuse ``value`` unless it is plain data: an allowlisted callable given anything else
        may call into it (an instance's ``__iter__``, ``__index__``, ``__fspath__``, ``keys``,
        ``__repr__``; a class's metaclass), which is code of the file's choosing. Plain: scalars,
        text and bytes, torch's tensors, storages and dtypes, numpy's dtypes, scalars and
        non-object arrays, allowlisted types, this load's stand-ins, and builtin containers,
        ``deque``s, ``torch.Size``s and allowlisted namespaces of plain data (boundedly)."""
        stack, count = [value], 0
        while stack:
            v = stack.pop()
            count += 1
            if count > _MAX_CHECKED:
                raise Refused(f"{where}: more values than the trusted load checks")
            t = type(v)
            if t in _SCALARS or id(v) in self.stand_ins or _torch_plain(v):
                continue
            if t in _SEQUENCES:
                stack.extend(v)
            elif t in (dict, OrderedDict):
                stack.extend(v.keys())
                stack.extend(v.values())
            elif isinstance(v, type):
                if not self._safe_type(v):
                    raise Refused(f"{where} is given the class {self.name(v)}", self.name(v))
            elif self._safe_type(t):  # an allowlisted type's instance: its methods are its own
                if _numpy_object(v):
                    raise Refused(f"{where} is given an array of Python objects")
                attrs = getattr(v, "__dict__", None)
                if isinstance(attrs, dict):  # a Namespace: what it holds
                    stack.extend(attrs.values())
            else:
                raise Refused(
                    f"{where} is given a {self.name(t)} instance, and would call into it (the "
                    "class's own code)",
                    self.name(t),
                )

    def _defaultdict(self, func: Any, factory: Any = None, *rest: Any) -> Any:
        """``defaultdict(factory, …)``: the factory is called for every missing key, so it must be
        a builtin type (``int``, ``list`` …) or none."""
        if factory is not None and not (
            isinstance(factory, type) and factory.__module__ == "builtins"
        ):
            raise Refused(f"a defaultdict whose factory is {self.name(factory)}")
        self.plain(rest, "defaultdict")
        return func(factory, *rest)

    def _numpy_reconstruct(self, func: Any, subtype: Any, *rest: Any) -> Any:
        """numpy's ``_reconstruct(ndarray, shape, dtype)``: an ndarray, not a subclass (its
        ``__array_finalize__`` would run)."""
        import numpy

        if subtype is not numpy.ndarray:
            raise Refused(f"numpy's _reconstruct of {self.name(subtype)}")
        self.plain(rest, "numpy's _reconstruct")
        return func(subtype, *rest)

    def _reconstructor(self, _func: Any, cls: Any, base: Any, state: Any) -> Any:
        """``copyreg._reconstructor(cls, base, state)``: an instance of ``cls`` made the way a
        ``base`` makes it; ``base`` must be ``object`` or a builtin type."""
        if base is not object and getattr(base, "__module__", None) != "builtins":
            raise Refused(f"copyreg._reconstructor with the base {self.name(base)}")
        if not isinstance(cls, type) or not issubclass(cls, base):
            raise Refused(f"copyreg._reconstructor of {self.name(cls)}")
        obj = self.new(cls, (), {}, "copyreg._reconstructor")
        if base is not object and state is not None:
            self.plain(state, "copyreg._reconstructor's state")
            base.__init__(obj, state)
        return obj

    def _rebuild_from_type(
        self, func: Any, inner: Any, new_type: Any, args: Any, state: Any
    ) -> Any:
        """torch's ``_rebuild_from_type_v2(inner, new_type, args, state)``: ``inner(*args)``
        (called under this policy) made a ``new_type`` (a tensor subclass) with ``state`` set
        by torch's own code."""
        import torch

        if not (
            isinstance(new_type, type)
            and issubclass(new_type, torch.Tensor)
            and (new_type in (torch.Tensor, torch.nn.Parameter) or self.is_class(new_type))
        ):
            raise Refused(f"a tensor rebuilt as {self.name(new_type)}, which is not admitted")
        if not isinstance(args, tuple):
            raise Refused("a tensor rebuilt from arguments that are not a tuple")
        rebuilt = self.call(inner, args)
        return func(lambda: rebuilt, new_type, (), state)

    def _rebuild_wrapper_subclass(self, func: Any, cls: Any, *rest: Any) -> Any:
        if not self.is_class(cls):
            raise Refused(f"a tensor subclass {self.name(cls)} that is not admitted")
        return func(cls, *rest)

    # -- state and items -------------------------------------------------------------------

    def build(self, inst: Any, state: Any) -> None:
        cls = type(inst)
        if cls in self.own_code_allowed:
            if hasattr(cls, "__setstate__"):
                self._running(cls, lambda: inst.__setstate__(state))
                return
        elif cls not in self.admitted and not self._safe_type(cls) and not self._torch_value(cls):
            raise Refused(f"BUILD sets the state of a {self.name(cls)}, which is not admitted")
        if type(state) not in _STATE_TYPES:  # a mapping of the file's making: its keys() is code
            raise Refused(f"BUILD of a {self.name(cls)} with a {self.name(type(state))} state")
        setstate = getattr(cls, "__setstate__", None)
        if setstate is not None:  # the admission found it torch's own (or a builtin's)
            setstate(inst, state)
            return
        slotstate = None
        if isinstance(state, tuple) and len(state) == 2:
            state, slotstate = state
        if state:
            if not isinstance(state, dict):
                raise Refused(f"BUILD of a {self.name(cls)} with a state that is not a dict")
            inst_dict = object.__getattribute__(inst, "__dict__")
            for k, v in state.items():
                inst_dict[sys.intern(k) if type(k) is str else k] = v
        if slotstate:
            if not isinstance(slotstate, dict):
                raise Refused(f"BUILD of a {self.name(cls)} with slots that are not a dict")
            for k, v in slotstate.items():
                slot = _slot(cls, k)
                if slot is None:
                    raise Refused(f"BUILD sets {k!r} on a {self.name(cls)}, which is no slot")
                slot.__set__(inst, v)

    def _torch_value(self, cls: type) -> bool:
        import torch

        return cls in (torch.Tensor, torch.nn.Parameter)

    def container(self, target: Any, method: str) -> None:
        """Whether SETITEMS/APPENDS/ADDITEMS may store into ``target`` (refused otherwise)."""
        cls = type(target)
        if cls in (dict, list, set) or self._safe_type(cls) or cls in self.admitted:
            return  # a builtin's, or the admission found the method the default one
        if cls in self.own_code_allowed:
            return
        raise Refused(f"{method} on a {self.name(cls)}, which is not admitted")

    def keys(self, keys: Any, op: str) -> None:
        """Refuse keys (dict keys, set members) whose hashing or comparing would run a class's
        own code: a key is a scalar, text, a tuple of keys, one of torch's or numpy's values, an
        allowlisted value, or an instance of an admitted class that hashes by default."""
        stack = list(keys)
        while stack:
            key = stack.pop()
            t = type(key)
            if t in _SCALARS or id(key) in self.stand_ins or _torch_plain(key):
                continue
            if t is tuple or t is frozenset:
                stack.extend(key)
            elif issubclass(t, type):
                if type(key) is not type and not self._safe_type(key):
                    raise Refused(f"{op} uses the class {self.name(key)} as a key")
            elif not (self._safe_type(t) or t in self.hashable or t in self.own_code_allowed):
                raise Refused(
                    f"{op} uses a {self.name(t)} as a key: hashing it runs the class's own code",
                    self.name(t),
                )

    def _running(self, cls: type, do: Callable[[], Any]) -> Any:
        """``do()``, with the audit hook told whose own code runs."""
        saved, Rebuilding.current = Rebuilding.current, self.name(cls)
        try:
            return do()
        finally:
            Rebuilding.current = saved


_MAX_CHECKED = 1_000_000  # values plain() looks at for one call
# what a BUILD's state may be: torch's own __setstate__ iterates or updates from it
_STATE_TYPES = (dict, OrderedDict, tuple, list, type(None), bool, int, float, str, bytes)


def _never_called() -> frozenset[int]:
    """Allowlisted values REDUCE never calls: ``enum.Enum``'s functional API makes a class from
    the pickle's namespace (its ``_missing_``, ``__set_name__`` …); a real pickle names an Enum
    class by reference."""
    return frozenset({id(enum.Enum)})


_NEVER_CALLED = _never_called()


def is_named_tuple(cls: type) -> bool:
    """A ``collections.namedtuple`` class: its ``__new__`` is generated from its field names."""
    new = vars(cls).get("__new__")
    new = getattr(new, "__func__", new)  # a class body's __new__ is a staticmethod
    return (
        issubclass(cls, tuple)
        and hasattr(cls, "_fields")
        and getattr(new, "__globals__", {}).get("_tuple_new") is tuple.__new__
    )


def _builtin_base(cls: type) -> type:
    """The nearest base of ``cls`` that is a builtin type; only object and the containers are
    made by the default mechanism (a ``type`` subclass would build a class from the pickle's
    namespace: ``__set_name__``, ``__init_subclass__``)."""
    base = next(k for k in cls.__mro__ if k.__module__ == "builtins")
    if base not in _CONSTRUCTIBLE:
        raise Refused(f"an instance of {cls.__qualname__}, a {base.__name__} subclass")
    return base


_CONSTRUCTIBLE = (object, dict, list, tuple, set, frozenset, int, float, complex, str, bytes)
_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray})
_SEQUENCES = frozenset({tuple, list, set, frozenset, __import__("collections").deque})


def _torch_plain(v: Any) -> bool:
    """A tensor, storage, dtype, device, layout … of torch's own, or a numpy dtype, scalar or
    array of numbers: values whose methods are torch's and numpy's."""
    module = type(v).__module__ or ""
    if module == "torch" or module.startswith(("torch.", "torch._C")):
        import torch

        if type(v) is torch.Size:
            return all(type(d) is int for d in v)
        return (
            isinstance(v, (torch.Tensor, torch.UntypedStorage, torch.storage.TypedStorage))
            or (
                type(v)
                in (torch.dtype, torch.device, torch.layout, torch.memory_format, torch.qscheme)
            )
            or type(v).__name__ == "StorageType"
        )
    if module == "numpy" or module.startswith("numpy."):
        import numpy

        if isinstance(v, numpy.ndarray):
            return not v.dtype.hasobject
        return isinstance(v, (numpy.dtype, numpy.generic)) and not isinstance(v, numpy.object_)
    return False


def _numpy_object(v: Any) -> bool:
    return bool(getattr(getattr(v, "dtype", None), "hasobject", False))


def _slot(cls: type, name: Any) -> Any:
    """The slot descriptor ``name`` of ``cls``, or None when it is anything else (a property's
    setter is code)."""
    import types

    if not isinstance(name, str):
        return None
    for klass in cls.__mro__:
        value = vars(klass).get(name)
        if value is not None:
            return value if isinstance(value, types.MemberDescriptorType) else None
    return None


# the standard library's Python unpickler (typeshed declares too little of it for subclassing)
_PyUnpickler: Any = pickle._Unpickler


_LOCAL = threading.local()  # the Rebuilding of the torch_load running in this thread


def torch_load(file: Any, rebuilding: Rebuilding) -> Any:
    """``torch.load(file)`` with this module as its pickle module, under ``rebuilding`` (torch
    makes the unpickler itself: it finds the policy through this thread's state)."""
    import torch

    saved = getattr(_LOCAL, "rebuilding", None)
    _LOCAL.rebuilding = rebuilding
    try:
        module = sys.modules[__name__]
        return torch.load(file, map_location="cpu", weights_only=False, pickle_module=module)
    finally:
        _LOCAL.rebuilding = saved


class Unpickler(_PyUnpickler):
    """``pickle._Unpickler`` under the ``Rebuilding`` of the ``torch_load`` that runs it."""

    dispatch: ClassVar[dict[int, Any]] = dict(_PyUnpickler.dispatch)

    @property
    def _r(self) -> Rebuilding:
        rebuilding = getattr(_LOCAL, "rebuilding", None)
        if rebuilding is None:
            raise Refused("no trusted load is in progress")
        return rebuilding

    # torch assigns its persistent_load to the instance: kept here, called through the check
    @property
    def persistent_load(self) -> Callable[[Any], Any]:
        return self._checked_persistent_load

    @persistent_load.setter
    def persistent_load(self, loader: Callable[[Any], Any]) -> None:
        self._torch_persistent_load = loader

    def _checked_persistent_load(self, pid: Any) -> Any:
        """torch's persistent_load, but for the legacy layout's ``("module", cls, file, source)``:
        the class itself, when admitted (torch would compare its source with the file's and
        may write a ``.patch`` file named by the class)."""
        if isinstance(pid, tuple) and pid and pid[0] in ("module", b"module"):
            cls = pid[1] if len(pid) > 1 else None
            if not self._r.is_class(cls):
                raise Refused(f"a legacy module id names {self._r.name(cls)}, not admitted")
            return cls
        loader = getattr(self, "_torch_persistent_load", None)
        if loader is None:
            raise Refused("a persistent id outside a torch checkpoint")
        return loader(pid)

    def find_class(self, module: str, name: str) -> Any:
        import _compat_pickle

        if self.proto < 3 and self.fix_imports:
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            elif module in _compat_pickle.IMPORT_MAPPING:
                module = _compat_pickle.IMPORT_MAPPING[module]
        dotted = f"{module}.{name}"
        if dotted not in self._r.names:
            raise Refused(f"the pickle names {dotted}, which the scan did not clear", dotted)
        return self._r.names[dotted]

    def _instantiate(self, klass: Any, args: list[Any]) -> None:  # OBJ, INST
        self.append(self._r.new(klass, tuple(args), {}, "OBJ"))

    def load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self._r.new(cls, tuple(args), {}, "NEWOBJ"))

    def load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self._r.new(cls, tuple(args), dict(kwargs), "NEWOBJ_EX"))

    def load_reduce(self) -> None:
        args = self.stack.pop()
        func = self.stack[-1]
        if not isinstance(args, tuple):
            raise Refused("REDUCE with arguments that are not a tuple")
        self.stack[-1] = self._r.call(func, args)

    def load_build(self) -> None:
        state = self.stack.pop()
        self._r.build(self.stack[-1], state)

    def load_setitem(self) -> None:
        self._r.container(self.stack[-3], "SETITEM")
        self._r.keys([self.stack[-2]], "SETITEM")
        super().load_setitem()

    def load_setitems(self) -> None:
        self._r.container(self._marked_container(), "SETITEMS")
        self._r.keys(self.stack[0::2], "SETITEMS")
        super().load_setitems()

    def load_dict(self) -> None:
        self._r.keys(self.stack[0::2], "DICT")
        super().load_dict()

    def load_frozenset(self) -> None:
        self._r.keys(self.stack, "FROZENSET")
        super().load_frozenset()

    def load_append(self) -> None:
        self._r.container(self.stack[-2], "APPEND")
        super().load_append()

    def load_appends(self) -> None:
        self._r.container(self._marked_container(), "APPENDS")
        super().load_appends()

    def load_additems(self) -> None:
        self._r.container(self._marked_container(), "ADDITEMS")
        self._r.keys(self.stack, "ADDITEMS")
        super().load_additems()

    def _marked_container(self) -> Any:
        """The value below the pending MARK: the container its items go to."""
        if not self.metastack or not self.metastack[-1]:
            raise pickle.UnpicklingError("could not find MARK")
        return self.metastack[-1][-1]

    def get_extension(self, code: int) -> Any:
        raise Refused(f"the pickle uses copyreg's extension registry (code {code})")

    def load_next_buffer(self) -> None:
        raise Refused("the pickle refers to an out-of-band buffer")


for _op, _name in (
    (pickle.NEWOBJ, "load_newobj"),
    (pickle.NEWOBJ_EX, "load_newobj_ex"),
    (pickle.REDUCE, "load_reduce"),
    (pickle.BUILD, "load_build"),
    (pickle.SETITEM, "load_setitem"),
    (pickle.SETITEMS, "load_setitems"),
    (pickle.APPEND, "load_append"),
    (pickle.APPENDS, "load_appends"),
    (pickle.ADDITEMS, "load_additems"),
    (pickle.DICT, "load_dict"),
    (pickle.FROZENSET, "load_frozenset"),
    (pickle.NEXT_BUFFER, "load_next_buffer"),
):
    Unpickler.dispatch[_op[0]] = getattr(Unpickler, _name)


def load(file: Any, **kwargs: Any) -> Any:
    """``pickle.load`` for torch.load's legacy layouts (its magic number, storage lists)."""
    return Unpickler(file, **kwargs).load()
