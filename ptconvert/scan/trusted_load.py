"""Loading a pickle whose classes the user trusts (``--trust``, ``--allow``): the classes are
rebuilt by the default mechanism, no code of theirs runs, and nothing else is called.

Trust is a grant to rebuild the classes the scan named, never to run their code on the file's
data. The load is torch.load's container handling with ptconvert's own unpickler
(``pickles/rebuild.py``): a global resolves only to a value of the allowlist or a class the scan
named; an instance is made with ``object.__new__`` and its state set by ``__dict__`` update or
torch's own ``__setstate__``. A class whose rebuild would run its own code (a ``__new__``,
``__setstate__``, … of its own: ``admission.own_code``) is refused by ``--trust`` and admitted
only by ``--allow`` naming it, with a warning. Only the modules of the classes trust covers are
imported, never a ``__main__`` module (importing one runs a program).

The load runs first in a spawned process under an audit hook (``load_probe.py``) and within
``--load-timeout``: a load that would execute code, start a process, open a socket, write a file
or import a module is stopped there and named; one that does not end is stopped at the limit.
Then this process loads the same bytes the same way.

A function or class the pickle only keeps as a value (an activation such as
``torch._C._nn.gelu``, a hyperparameter's ``nn.GELU``) is resolved to a stand-in that raises if
called, and swapped for it once the load is done.
"""

from __future__ import annotations

import functools
import importlib
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert.errors import (
    CorruptFileError,
    MissingRequirementError,
    NeedsTrustError,
    PtconvertError,
    UnsafeInputError,
    UnsupportedConversionError,
)
from ptconvert.pickles.rebuild import is_named_tuple
from ptconvert.scan.admission import hashes_by_default
from ptconvert.scan.analysis import CONSTRUCTS
from ptconvert.scan.guard import guard

DEFAULT_LOAD_TIMEOUT_S = 300.0


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


@dataclass
class Prepared:
    """What a trusted load may resolve, made before any byte of the pickle is read."""

    names: dict[str, Any]
    admitted: set[type] = field(default_factory=set)
    own_code_allowed: set[type] = field(default_factory=set)
    named: set[type] = field(default_factory=set)  # classes --allow named (their hashing too)
    callables: set[int] = field(default_factory=set)
    deferred: dict[int, _Deferred] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass
class TrustedLoad:
    value: Any
    warnings: list[str]


def trusted_load(
    path: Path,
    *,
    trust: bool,
    allow: Iterable[str] = (),
    timeout: float | None = DEFAULT_LOAD_TIMEOUT_S,
) -> TrustedLoad:
    """The object a trusted pickle holds, its classes rebuilt by the default mechanism (those
    ``allow`` names by their own code). The load is tried first in a process of its own under
    an audit hook, within ``timeout`` seconds (None: no probe, for that process itself)."""
    from ptconvert.spawn import probe

    allow = list(allow)
    prepared = prepare(path, trust=trust, allow=allow)
    if timeout is not None:
        what = "the trusted load"
        probe(_probe_child, (str(path), trust, allow), path=path, timeout=timeout, what=what)
    return TrustedLoad(load_prepared(path, prepared), prepared.warnings)


def _probe_child(path: str, trust: bool, allow: list[str], send: Any, parent: int) -> None:
    """The probe's process: the same preparation and load, under the audit hook."""
    from ptconvert.scan.load_probe import audited
    from ptconvert.spawn import serve_probe

    def prepared() -> Prepared:
        done = prepare(Path(path), trust=trust, allow=allow)
        _warm_up()
        return done

    serve_probe(send, parent, prepared, lambda done: load_prepared(Path(path), done), audited)


def prepare(path: Path, *, trust: bool, allow: list[str]) -> Prepared:
    """The scan (refusing what it refuses), the imports trust covers, and each class judged:
    admitted, or allowed to run its own code by ``--allow``, or refused naming it."""
    scans = guard(path, trust=trust, allow=allow)
    names = sorted({c for s in scans for c in s.classes})
    constructed = {f.global_name for s in scans for f in s.findings if f.reason in CONSTRUCTS}
    prepared = Prepared(dict(_allowlisted()))
    prepared.callables = {id(v) for v in prepared.names.values()}
    own: dict[str, list[str]] = {}
    for name in names:
        value = _imported(path, name)
        if isinstance(value, type):
            from ptconvert.scan.admission import own_code

            hooks = own_code(value)
            if name in allow:
                prepared.named.add(value)
            if not hooks:
                prepared.admitted.add(value)
            elif name in allow:
                prepared.own_code_allowed.add(value)
                prepared.warnings.append(
                    f"--allow {name}: its own code ({', '.join(hooks)}) runs on this file's "
                    "data while it is unpickled"
                )
            elif name in constructed:
                own[name] = hooks
            prepared.names[name] = value  # a class kept as a value: construct it is refused
        else:
            stand_in = _Deferred(path, name, value)
            prepared.deferred[id(stand_in)] = stand_in
            prepared.names[name] = stand_in
    if own:
        listed = "; ".join(f"{n} ({', '.join(h)})" for n, h in sorted(own.items()))
        raise NeedsTrustError(
            "rebuilding these classes runs their own code on the file's data, which --trust "
            f"does not admit: {listed}",
            path=path,
            hint="--trust admits classes rebuilt by the default mechanism only; --allow "
            + " --allow ".join(sorted(own))
            + " admits them one by one (their code then runs on this file's data: only for a "
            "source you trust)",
        )
    return prepared


def load_prepared(path: Path, prepared: Prepared) -> Any:
    """torch.load's container handling with the rebuilding unpickler, under ``prepared``."""
    from ptconvert.pickles import rebuild

    _refuse_torchscript(path)
    rebuilding = rebuild.Rebuilding(
        prepared.names,
        prepared.admitted,
        prepared.own_code_allowed,
        prepared.callables,
        set(prepared.deferred),
        {c for c in prepared.admitted if hashes_by_default(c) or c in prepared.named},
    )
    try:
        loaded = rebuild.torch_load(path, rebuilding)
    except PtconvertError:
        raise  # a stand-in called: said as the refusal it is
    except rebuild.Refused as exc:
        raise UnsafeInputError(
            f"refused at load: {exc}", path=path, hint="run `ptconvert scan` on it"
        ) from None
    except Exception as exc:  # content it cannot build, a storage that does not fit …
        raise CorruptFileError(
            f"the trusted load cannot rebuild it: {type(exc).__name__}: {_first(exc)}",
            path=path,
        ) from None
    if prepared.deferred:
        loaded = _swapped(loaded, prepared.deferred, {})
    _refuse_foreign_parts(loaded, path)
    return loaded


# a module's own hooks: torch calls what they hold when the model runs or is saved
_HOOKS = re.compile(r"^_.*hooks.*$")


def _refuse_foreign_parts(value: Any, path: Path) -> None:
    """A loaded nn.Module whose tree would make torch call what the file chose when the model
    is used: a submodule that is no nn.Module (``eval()`` calls its ``train``), a hook that is
    not torch's own, an instance attribute that shadows a method of its class (``forward``).
    Read through ``object``'s own lookups only."""
    import torch

    if not issubclass(type(value), torch.nn.Module):
        return
    stack, seen = [value], set()
    while stack:
        module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        attrs = object.__getattribute__(module, "__dict__")
        cls = type(module)
        for key, held in attrs.items():
            if key == "_modules" and type(held) in _MAPPINGS:
                for sub in held.values():
                    if sub is not None and not issubclass(type(sub), torch.nn.Module):
                        raise UnsafeInputError(
                            f"refused at load: a submodule of {cls.__qualname__} is a "
                            f"{type(sub).__qualname__}, not an nn.Module (torch would call it)",
                            path=path,
                        )
                    if sub is not None:
                        stack.append(sub)
            elif isinstance(key, str) and _HOOKS.match(key) and type(held) in _MAPPINGS:
                foreign = [h for h in held.values() if not _torch_own_value(h)]
                if foreign:
                    raise UnsafeInputError(
                        f"refused at load: {cls.__qualname__}.{key} holds "
                        f"{_described(foreign[0])}, which torch would call",
                        path=path,
                    )
            elif isinstance(key, str) and _is_method(cls, key):
                raise UnsafeInputError(
                    f"refused at load: an instance of {cls.__qualname__} replaces its method "
                    f"{key!r} with a value of the file's",
                    path=path,
                )


def _described(value: Any) -> str:
    kind = value if issubclass(type(value), type) else type(value)
    return f"{kind.__module__}.{kind.__qualname__}" + ("" if kind is value else " instance")


def _torch_own_value(value: Any) -> bool:
    """A hook torch itself registers (weight_norm's WeightNorm …): an instance of torch's own."""
    module = type(value).__module__ or ""
    return not issubclass(type(value), type) and module.startswith("torch.")


def _is_method(cls: type, name: str) -> bool:
    return any(callable(vars(k).get(name)) and not name.startswith("__") for k in cls.__mro__)


def _refuse_torchscript(path: Path) -> None:
    """torch.load hands a TorchScript archive to torch.jit.load whatever unpickler it is
    given: the trusted load is for pickles only."""
    from ptconvert.formats import detect

    if not detect(path).handler.may_hold_module:
        raise UnsupportedConversionError(
            "the trusted load reads torch.save checkpoints only", path=path
        )


@functools.cache
def _allowlisted() -> dict[str, Any]:
    """The allowlist's names resolved to their values: torch's, the standard library's and
    numpy's modules only (imported once, before any pickle is read)."""
    from ptconvert.pickles.allowlist import SAFE_GLOBALS

    out: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy.core's deprecation
        for dotted in sorted(SAFE_GLOBALS):
            module, _, name = dotted.rpartition(".")
            try:
                out[dotted] = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError):
                continue  # not in this torch or numpy: a pickle naming it is refused
    return out


def _warm_up() -> None:
    """One load of a tiny checkpoint through the same path: torch imports what its loading
    needs on first use, and no import may happen once the hook is armed."""
    import io

    import torch

    from ptconvert.pickles import rebuild

    names = _allowlisted()
    rebuilding = rebuild.Rebuilding(dict(names), set(), set(), {id(v) for v in names.values()})
    sample = {"w": torch.zeros(1), "p": torch.nn.Parameter(torch.zeros(1))}
    for zipped in (True, False):  # the zip layout and the legacy one
        buf = io.BytesIO()
        torch.save(sample, buf, _use_new_zipfile_serialization=zipped)
        buf.seek(0)
        rebuild.torch_load(buf, rebuilding)


def _first(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _imported(path: Path, dotted: str) -> Any:
    """The global a trusted pickle names, imported: its module's code runs, which the user's
    trust covers for the modules of the classes the scan named, never for a ``__main__``
    module (importing one runs a program: ``pygments.__main__`` is pygments' command line)."""
    module, _, name = dotted.rpartition(".")
    if "__main__" in module.split(".")[1:] or not module:
        raise UnsafeInputError(
            f"refused: the pickle names {dotted}, and importing {module or dotted!r} would run "
            "a program's entry point, not define a class",
            path=path,
            hint="run `ptconvert scan` on it; do not load it",
        )
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
    """``value`` with every stand-in replaced by what it stands for, touching the file's objects
    only through the builtin types' own methods and object's (never a method of a class the
    file named): builtin dicts, lists and sets in place, ``__dict__`` and slot attributes,
    tuples and frozensets rebuilt (a named tuple by ``tuple.__new__``); other tuple subclasses
    and anything else are kept as they are (a stand-in left there raises if called)."""
    t = type(value)
    if t is _Deferred and id(value) in deferred:
        return value.value
    if t in _SCALARS or issubclass(t, type):
        return value
    if id(value) in memo:
        return memo[id(value)]
    memo[id(value)] = value

    def swap(v: Any) -> Any:
        return _swapped(v, deferred, memo)

    if t in _MAPPINGS:
        items = [(swap(k), swap(v)) for k, v in t.items(value)]
        t.clear(value)
        for k, v in items:
            t.__setitem__(value, k, v)
    elif t is list:
        list.__setitem__(value, slice(None), [swap(v) for v in value])
    elif t is set:
        members = [swap(v) for v in set.__iter__(value)]
        set.clear(value)
        set.update(value, members)
    elif t in (tuple, frozenset) or is_named_tuple(t):
        members = [swap(v) for v in (value if t is frozenset else tuple.__iter__(value))]
        if any(a is not b for a, b in zip(members, value, strict=True)):
            rebuilt = frozenset(members) if t is frozenset else tuple.__new__(t, members)
            memo[id(value)] = rebuilt
            return rebuilt
    elif not issubclass(t, (tuple, frozenset, dict, list, set)):
        try:
            attrs = object.__getattribute__(value, "__dict__")
        except AttributeError:
            attrs = None
        if type(attrs) is dict:
            swap(attrs)
        for name in _slot_names(t):
            slot = _slot_descriptor(t, name)
            try:
                current = slot.__get__(value, t)
            except AttributeError:
                continue
            new = swap(current)
            if new is not current:
                slot.__set__(value, new)
    return value


_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes})


def _mappings() -> tuple[type, ...]:
    import collections

    return (dict, collections.OrderedDict, collections.defaultdict, collections.Counter)


_MAPPINGS = _mappings()


def _slot_descriptor(cls: type, name: str) -> Any:
    return next(vars(k)[name] for k in cls.__mro__ if name in vars(k))


def _slot_names(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        names += [slots] if isinstance(slots, str) else [n for n in slots if n != "__dict__"]
    return [n for n in names if n != "__weakref__"]
