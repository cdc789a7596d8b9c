"""Loading a pickle whose classes the user trusts (``--trust``, ``--allow``): enforced by torch's
restricted unpickler, not only by the scan that came before.

``torch.load(weights_only=True)`` runs with exactly the globals the scan named allowlisted
(``torch.serialization.safe_globals``), never ``weights_only=False`` and with no fallback. Classes
the scan saw constructed are allowlisted as they are: constructing them is what trust admits.
A function or class the pickle only keeps as a value (an activation such as
``torch._C._nn.gelu``, a hyperparameter's ``nn.GELU``) is allowlisted as a stand-in that raises
if called, and swapped for it once the load is done: where the scanner missed a call (a class
set as a tensor's ``set_``, which torch's BUILD calls), the load still cannot make it.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ptconvert.errors import (
    CorruptFileError,
    MissingRequirementError,
    PtconvertError,
    UnsafeInputError,
    UnsupportedConversionError,
)
from ptconvert.scan.analysis import CONSTRUCTS, INSTANTIATES
from ptconvert.scan.guard import guard


class _Deferred:
    """What the unpickler gets in place of a global the pickle keeps as a value."""

    def __init__(self, path: Path, name: str, value: Any) -> None:
        self.path, self.name, self.value = path, name, value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise UnsafeInputError(
            f"refused at load: the pickle calls {self.name} while it is unpickled (trust admits "
            "constructing the classes it names, never calling other code)",
            path=self.path,
            hint="run `ptconvert scan` on it; do not load it",
        )


def trusted_load(path: Path, *, trust: bool, allow: Iterable[str] = ()) -> Any:
    """The object a trusted pickle holds, loaded by torch's restricted unpickler with exactly the
    globals the scan named allowlisted. What it cannot build is said (the global) and refused."""
    import pickle

    import torch

    scans = guard(path, trust=trust, allow=allow)
    names = sorted({c for s in scans for c in s.classes})
    constructed = {f.global_name for s in scans for f in s.findings if f.reason in CONSTRUCTS}
    newobj = {f.global_name for s in scans for f in s.findings if f.reason == INSTANTIATES}
    allowed: list[Any] = []
    deferred: dict[int, _Deferred] = {}
    for name in names:
        value = _imported(path, name)
        if isinstance(value, type) and name in constructed:
            if name not in newobj and not issubclass(value, enum.Enum):
                raise UnsafeInputError(  # what the scan took for an Enum member by value
                    f"refused at load: the pickle calls {name} with its own argument, and "
                    "only an Enum member is rebuilt that way (trust admits constructing the "
                    "classes a pickle names, not calling them with its data)",
                    path=path,
                    hint="run `ptconvert scan` on it; do not load it",
                )
            allowed.append(value)
        else:
            stand_in = _Deferred(path, name, value)
            deferred[id(stand_in)] = stand_in
            allowed.append((stand_in, name))
    try:
        with torch.serialization.safe_globals(allowed):
            loaded = torch.load(path, map_location="cpu", weights_only=True)
    except PtconvertError:
        raise  # a stand-in called: said as the refusal it is
    except pickle.UnpicklingError as exc:  # content it cannot build (benign or not): exit 4
        raise UnsupportedConversionError(
            f"torch's restricted unpickler refuses this file, so it is not loaded: {_first(exc)}",
            path=path,
            hint="it allowlists only the globals the scan named "
            f"({', '.join(names) or 'none'}); convert its tensors with --to safetensors instead",
        ) from None
    except Exception as exc:  # a class's own __setstate__, a storage that does not fit …
        raise CorruptFileError(
            f"torch.load (weights_only=True) cannot load it: {type(exc).__name__}: {_first(exc)}",
            path=path,
        ) from None
    return _swapped(loaded, deferred, {}) if deferred else loaded


def _first(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _imported(path: Path, dotted: str) -> Any:
    """The global a trusted pickle names, imported (its module's code runs: that is the trust)."""
    module, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:  # the classes the pickle names live in the user's code
        raise MissingRequirementError(
            f"the pickle needs the Python module {exc.name!r}, which is not importable",
            path=path,
            hint="run where that code is importable (PYTHONPATH), or convert its tensors with "
            "--to safetensors (or its state dict with --model)",
        ) from None
    except AttributeError:
        raise MissingRequirementError(
            f"the pickle needs {dotted}, which its module does not define", path=path
        ) from None


def _swapped(value: Any, deferred: dict[int, _Deferred], memo: dict[int, Any]) -> Any:
    """``value`` with every stand-in replaced by what it stands for: in place where it can be
    (dict keys and values, lists, sets, ``__dict__`` and ``__slots__`` attributes); a tuple or
    frozenset that held one is rebuilt (one rebuild for every reference to it), others are kept
    as they are (a ``torch.Size`` stays one)."""
    if isinstance(value, _Deferred) and id(value) in deferred:
        return value.value
    if value is None or isinstance(value, (str, bytes, int, float, type)):
        return value
    if id(value) in memo:
        return memo[id(value)]
    memo[id(value)] = value

    def swap(v: Any) -> Any:
        return _swapped(v, deferred, memo)

    if isinstance(value, dict):
        items = [(swap(k), swap(v)) for k, v in value.items()]
        value.clear()
        value.update(items)
    elif isinstance(value, list):
        value[:] = [swap(v) for v in value]
    elif isinstance(value, set):
        members = [swap(v) for v in value]
        value.clear()
        value.update(members)
    elif isinstance(value, (tuple, frozenset)):
        members = [swap(v) for v in value]
        if any(a is not b for a, b in zip(members, value, strict=True)):
            rebuilt = _rebuilt(value, members)
            memo[id(value)] = rebuilt
            return rebuilt
    else:
        if isinstance(getattr(value, "__dict__", None), dict):
            swap(vars(value))
        for name in _slot_names(type(value)):
            if hasattr(value, name):
                setattr(value, name, swap(getattr(value, name)))
    return value


def _rebuilt(value: tuple[Any, ...] | frozenset[Any], members: list[Any]) -> Any:
    if isinstance(value, frozenset):
        return type(value)(members)
    if hasattr(value, "_fields"):  # a named tuple takes its fields as arguments
        return type(value)(*members)
    return type(value)(members)


def _slot_names(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        names += [slots] if isinstance(slots, str) else [n for n in slots if n != "__dict__"]
    return [n for n in names if n != "__weakref__"]
