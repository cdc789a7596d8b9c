"""The gate every load goes through: scan first, refuse what is not clearly safe to load."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ptconvert.errors import (
    CorruptFileError,
    MissingRequirementError,
    NeedsTrustError,
    UnsafeInputError,
)
from ptconvert.scan.scanner import FileScan, expand, scan_file

_CACHE: dict[tuple[str, int, int, int], FileScan] = {}


def _scan(path: Path) -> FileScan:
    """One scan per file version in a process: entry points refuse early, steps check again."""
    st = path.stat()
    key = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _CACHE:
        _CACHE[key] = scan_file(path)
    return _CACHE[key]


def refuse_unsafe(*paths: str | Path | None) -> None:
    """What every command that reads files does first, before detecting formats or planning:
    refuse a dangerous or unreadable file. ``needs-code`` is left to the step that loads."""
    for p in paths:
        if p is not None and Path(p).exists():
            guard(p, trust=True)


def guard(path: str | Path, *, trust: bool = False, allow: Iterable[str] = ()) -> list[FileScan]:
    """Scan ``path`` (a file or every file of a directory) before anything loads it.

    ``dangerous`` is refused (exit 10); a file the scan cannot read completely is refused as
    unreadable (exit 3); ``needs-code`` is refused (exit 11) unless ``trust``, or unless every
    class it needs is among ``allow`` (``--allow mod.Name``, one by one).
    """
    results = [_scan(f) for f in expand([path])]
    for r in results:
        if r.verdict == "dangerous":
            worst = [f for f in r.findings if f.severity == "dangerous"][:3]
            detail = "; ".join(
                f"{f.global_name or f.opcode} in {f.member}: {f.reason}" for f in worst
            )
            raise UnsafeInputError(
                f"refused: loading this file could run code ({detail})",
                path=r.path,
                hint="run `ptconvert scan` on it for every finding; do not load it",
            )
    for r in results:
        if r.verdict == "error":
            why = next((f.reason for f in r.findings if f.severity == "error"), "")
            raise CorruptFileError(
                f"the security scan cannot read this file completely ({why}), so it is not loaded",
                path=r.path,
            )
    if not trust:
        for r in results:
            if r.verdict != "needs-code":
                continue
            native = [f.member for f in r.findings if "native code" in f.reason]
            if r.classes and set(r.classes) <= set(allow) and not native:
                continue  # every class it imports is named by --allow
            if native and not r.classes:
                raise NeedsTrustError(
                    "loading this file runs the native code it holds: " + ", ".join(native),
                    path=r.path,
                    hint="pass --trust if you trust its source",
                )
            needed = [c for c in r.classes if c not in allow] or native or ["?"]
            raise NeedsTrustError(
                "loading this file imports Python code: " + ", ".join(needed),
                path=r.path,
                hint="pass --trust (or --allow for each class) if you trust its source and "
                "these classes are importable",
            )
    return results


def trusted_load(path: Path, *, trust: bool, allow: Iterable[str] = ()) -> Any:
    """``torch.load`` of a pickle whose classes the user trusts, through torch's restricted
    unpickler (``weights_only=True``) with exactly the classes the scan named allowlisted
    (``safe_globals``): where the scanner missed a gadget, a callable nobody named still cannot
    be called. Never ``weights_only=False``, and no fallback: what the restricted unpickler
    cannot build is said (the global it names) and refused."""
    import pickle

    import torch

    scans = guard(path, trust=trust, allow=allow)
    names = sorted({c for s in scans for c in s.classes})
    classes: list[Any] = [_trusted_class(path, n) for n in names]
    try:
        with torch.serialization.safe_globals(classes):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UnsafeInputError(
            f"torch's restricted unpickler refuses this file, so it is not loaded: {first[:300]}",
            path=path,
            hint="it allowlists only the classes the scan named "
            f"({', '.join(names) or 'none'}); convert its tensors with --to safetensors instead",
        ) from None


def _trusted_class(path: Path, dotted: str) -> type:
    """The class a trusted pickle names, imported (its module's code runs: that is the trust).
    A function is refused: ``--trust`` admits constructing classes, never other calls."""
    import importlib

    module, _, name = dotted.rpartition(".")
    try:
        value = getattr(importlib.import_module(module), name)
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
    if not isinstance(value, type):
        raise UnsafeInputError(
            f"the pickle names {dotted}, a {type(value).__name__}, not a class: trust admits "
            "constructing classes, never calling other code",
            path=path,
        )
    return value
