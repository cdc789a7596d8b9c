"""Which classes ``--trust`` may rebuild: those the default mechanism rebuilds without running
any code of the class itself.

Unpickling an instance calls into its class: ``__new__`` (NEWOBJ), ``__init__`` (REDUCE),
``__setstate__`` (BUILD), ``__setitem__``/``append``/``extend``/``add`` (SETITEMS, APPENDS,
ADDITEMS), ``__del__`` (when it is collected), for an Enum rebuilt by value ``_missing_``, and
for nn.Module and Tensor subclasses ``__getattribute__``/``__setattr__`` (torch's own
rebuilding goes through them). A class is admitted by ``--trust`` when every one of those it has
is the default one: ``object``'s, a builtin type's, one of torch's own classes (``nn.Module``'s
``__setstate__``), or one that ``dataclasses`` generated; a metaclass never is. Any other is
the class's own code, which would run on the pickle's data: such a class is admitted only by
``--allow`` naming it (sympy's expression classes evaluate a string argument in ``__new__``).
The rebuilding unpickler never hands an instance to other code (``rebuild.Rebuilding.plain``),
so its other methods do not run at load, and an instance is a key or a set member only when
its ``__hash__`` and ``__eq__`` are default (``hashes_by_default``, checked where keys are
stored: transformers' GenerationConfig has its own and is admitted, never a key).
"""

from __future__ import annotations

import types
from typing import Any

from ptconvert.pickles.allowlist import denied_reason
from ptconvert.pickles.rebuild import is_named_tuple

# What the load (or the garbage collector) calls on an instance or its class.
HOOKS = (
    "__new__",
    "__setstate__",
    "__setitem__",
    "append",
    "extend",
    "add",
    "__del__",
    "_missing_",
)
# What torch's own rebuilding calls besides: nn.Module's ``__setstate__`` reads
# ``self.__dict__``, a tensor subclass's state is set attribute by attribute.
TORCH_HOOKS = ("__getattribute__", "__setattr__")
# Modules whose classes' hooks are the default mechanism (torch's are checked against the
# denylist too: torch.fx's GraphModule rebuilds itself by running generated code).
_DEFAULT_MODULES = frozenset(
    {"builtins", "collections", "enum", "abc", "typing", "_collections_abc"}
)
# What dataclasses generate for a class (from its field names, never from pickle data).
_GENERATED = frozenset({"__eq__", "__hash__", "__setattr__", "__delattr__"})
_DEFAULT_METACLASSES = ("builtins.type", "abc.ABCMeta", "enum.EnumType", "enum.EnumMeta")


def own_code(cls: type) -> list[str]:
    """The hooks of ``cls`` through which rebuilding an instance would run the class's own code
    (``["__new__", "__setstate__"]``); empty when the default mechanism rebuilds it."""
    hooks = HOOKS + (TORCH_HOOKS if _torch_rebuilt(cls) else ())
    found = [hook for hook in hooks if not _is_default(cls, hook)]
    if issubclass(cls, type):  # an instance of it is a class, made from the pickle's namespace
        found.append("a metaclass (__set_name__, __init_subclass__ of what it builds)")
    meta = type(cls)
    named = f"{meta.__module__}.{meta.__qualname__}"
    if named not in _DEFAULT_METACLASSES and not _torch_own(meta.__module__, meta.__qualname__):
        found.append(f"metaclass {meta.__module__}.{meta.__qualname__}")
    owner = _owner(cls, "__dict__")
    if owner is not None and not isinstance(vars(owner)["__dict__"], types.GetSetDescriptorType):
        found.append("__dict__")
    return found


def hashes_by_default(cls: type) -> bool:
    """Whether hashing and comparing an instance of ``cls`` runs none of its own code."""
    return _is_default(cls, "__hash__") and _is_default(cls, "__eq__")


def _torch_rebuilt(cls: type) -> bool:
    import torch

    return issubclass(cls, (torch.nn.Module, torch.Tensor))


def _owner(cls: type, name: str) -> type | None:
    """The class of ``cls``'s MRO that defines ``name`` (the one an instance gets it from)."""
    return next((k for k in cls.__mro__ if name in vars(k)), None)


def _is_default(cls: type, hook: str) -> bool:
    owner = _owner(cls, hook)
    if owner is None or owner is object:
        return True
    value = vars(owner)[hook]
    if hook == "__new__" and is_named_tuple(owner):
        return True
    if value is None:  # __hash__ = None: unhashable, nothing runs
        return True
    if owner.__module__ in _DEFAULT_MODULES or _torch_own(owner.__module__, owner.__qualname__):
        return True
    # a default put on the class by its maker (an Enum gets Enum.__new__ as its own __new__)
    fn = getattr(value, "__func__", value)
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module in _DEFAULT_MODULES or (module and _torch_own(module, qualname)):
        return True
    return hook in _GENERATED and _generated_by_dataclasses(owner, value)


def _torch_own(module: str, qualname: str) -> bool:
    """One of torch's own, outside the modules the denylist names (torch.fx, torch.jit,
    torch._dynamo …: they rebuild objects by running code)."""
    if module != "torch" and not module.startswith("torch."):
        return False
    return denied_reason(module, qualname) is None


def _generated_by_dataclasses(owner: type, value: Any) -> bool:
    code = getattr(value, "__code__", None)
    return (
        "__dataclass_params__" in vars(owner)
        and code is not None
        and code.co_filename.startswith("<")  # dataclasses compile their methods from text
    )
