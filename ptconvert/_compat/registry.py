"""The registry of hooks (see ``ptconvert._compat``): declaring, probing, patching, status.

Every touch of a private torch or transformers API, declared in one place.

A **hook** names what ptconvert patches, calls or reads that torch (or transformers) does not
promise to keep: the versions it was tested on, a cheap ``probe`` (hasattr, a signature, a line
of torch's source; never a model run) that says whether the installed version still has it, and
what happens when it does not: a declared fallback (said in ``fallback``), or a ``CompatError``
(exit 5) naming the hook and the installed version. No module outside this package reads
``torch._*``/``transformers.*._*`` or patches their attributes (tests/test_compat.py scans for it).

Patches are applied by one context manager, ``patched(*names, **options)``: under a lock, the
first thread to enter installs a patch and the last to leave puts torch's own back; the
replacement acts only for the threads inside the block (others get torch's own behaviour), with
the options that thread gave. ``python -m ptconvert._compat`` prints each hook's status.

Imports nothing of ptconvert but ``ptconvert.errors``, and torch or transformers only inside
functions (``import ptconvert`` imports neither).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ptconvert.errors import CompatError

TORCH_TESTED = "torch 2.13.0"
TRANSFORMERS_TESTED = "transformers 5.24.0"


@dataclass(frozen=True)
class Hook:
    """One private API ptconvert relies on."""

    name: str
    what: str  # what it patches, calls or reads
    package: str  # "torch" or "transformers": whose version the probe depends on
    tested: str  # the versions it was tested on
    probe: Callable[[], bool]  # whether the installed version still has what the hook uses
    fallback: str | None  # what happens when the probe fails; None: a CompatError is raised
    # a patch: installs itself, returns the function that puts torch's own back
    apply: Callable[[], Callable[[], None]] | None = None


HOOKS: dict[str, Hook] = {}


def declare(hook: Hook) -> Hook:
    assert hook.name not in HOOKS, hook.name
    HOOKS[hook.name] = hook
    return hook


def installed(package: str) -> str:
    """``torch 2.13.0`` (the installed version), or ``torch (not installed)``."""
    import importlib.metadata

    try:
        return f"{package} {importlib.metadata.version(package)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{package} (not installed)"


def probe(name: str) -> bool:
    """Whether the installed version still has what hook ``name`` relies on (checked each time:
    cheap, and a test may take it away)."""
    try:
        return bool(HOOKS[name].probe())
    except Exception:  # an import or attribute that moved: the hook cannot work
        return False


def failure(name: str) -> CompatError:
    hook = HOOKS[name]
    return CompatError(
        f"ptconvert's hook {name!r} ({hook.what}) does not fit the installed "
        f"{installed(hook.package)} (tested on {hook.tested})",
        hint="install a tested version; `python -m ptconvert._compat` lists every hook's status",
    )


def available(name: str) -> bool:
    """True when hook ``name`` can be used; False when it cannot and declares a fallback (the
    caller takes it); a hook without one raises ``CompatError``."""
    if probe(name):
        return True
    if HOOKS[name].fallback is None:
        raise failure(name)
    return False


_LOCK = threading.Lock()
_USERS: dict[str, int] = {}  # threads inside a patched block, by hook
_UNDO: dict[str, Callable[[], None]] = {}
_LOCAL = threading.local()  # this thread's options of each patch it is inside (a stack)


def options(name: str) -> dict[str, Any] | None:
    """The options this thread entered patch ``name`` with, or None outside it (the patched
    function then does what torch's own does)."""
    stack = getattr(_LOCAL, "stacks", {}).get(name)
    return stack[-1] if stack else None


@contextmanager
def patched(*names: str, **opts: Any) -> Iterator[dict[str, bool]]:
    """While it lasts, the patches ``names`` act for this thread with ``opts``; yields which of
    them are in place (a patch whose probe fails takes its fallback, or raises)."""
    usable = {name: available(name) for name in names}
    applied: list[str] = []
    stacks = _LOCAL.__dict__.setdefault("stacks", {})
    try:
        for name in (n for n, ok in usable.items() if ok):
            apply = HOOKS[name].apply
            assert apply is not None, f"{name} is not a patch"
            with _LOCK:
                if not _USERS.get(name):
                    _UNDO[name] = apply()
                _USERS[name] = _USERS.get(name, 0) + 1
            applied.append(name)
            stacks.setdefault(name, []).append(opts)
        yield usable
    finally:
        for name in reversed(applied):
            stacks[name].pop()
            with _LOCK:
                _USERS[name] -= 1
                if not _USERS[name]:
                    _UNDO.pop(name)()


def status() -> list[dict[str, Any]]:
    """Each hook: its name, what it touches, the versions tested, the probe, the fallback."""
    return [
        {
            "name": h.name,
            "what": h.what,
            "kind": "patch" if h.apply is not None else "use",
            "tested": h.tested,
            "installed": installed(h.package),
            "probe": "OK" if probe(h.name) else "FAILED",
            "fallback": h.fallback or "none: CompatError (exit 5)",
        }
        for h in HOOKS.values()
    ]
