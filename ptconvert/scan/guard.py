"""The gate every load goes through: scan first, refuse what is not clearly safe to load."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ptconvert.errors import CorruptFileError, NeedsTrustError, UnsafeInputError
from ptconvert.scan.analysis import Finding
from ptconvert.scan.code_files import SOURCE, loaded_by
from ptconvert.scan.scanner import FileScan, expand, scan_file

_CACHE: dict[tuple[str, int, int, int, str | None], FileScan] = {}


def _scan(path: Path) -> FileScan:
    """One scan per file version in a process: entry points refuse early, steps check again.
    A ``.py`` file's version includes whether a config of its folder imports it."""
    st = path.stat()
    key = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, loaded_by(path))
    if key not in _CACHE:
        _CACHE[key] = scan_file(path)
    return _CACHE[key]


def refuse_unsafe(*paths: str | Path | None) -> None:
    """What every command that reads files does first, before detecting formats or planning:
    refuse a dangerous or unreadable file. ``needs-code`` is left to the step that loads."""
    for p in paths:
        if p is not None and Path(p).exists():
            guard(p, trust=True, remote_code=True)


def is_code(f: Finding) -> bool:
    """A finding of a folder's own code: a ``.py`` file a loader imports, or a config's
    ``auto_map`` naming one."""
    return f.opcode in ("auto_map", SOURCE)


def guard(
    path: str | Path,
    *,
    trust: bool = False,
    allow: Iterable[str] = (),
    remote_code: bool = False,
) -> list[FileScan]:
    """Scan ``path`` (a file or every file of a directory) before anything loads it.

    ``dangerous`` is refused (exit 10); a file the scan cannot read completely is refused as
    unreadable (exit 3); a folder's own code (``auto_map`` and the ``.py`` files it imports) is
    refused (exit 11) unless ``remote_code`` (``--trust-remote-code``); a pickle's
    ``needs-code`` is refused (exit 11) unless ``trust``, or unless every class it needs is
    among ``allow`` (``--allow mod.Name``, one by one).
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
    if not remote_code:
        _refuse_code(Path(path), results, trust)
    if not trust:
        for r in results:
            if r.verdict != "needs-code" or all(is_code(f) for f in r.findings):
                continue
            native = [f.member for f in r.findings if "native code" in f.reason]
            classes = sorted(
                {f.global_name for f in r.findings if f.severity == "needs-code" and f.global_name}
                - {f.global_name for f in r.findings if is_code(f)}
            )
            if classes and set(classes) <= set(allow) and not native:
                continue  # every class it imports is named by --allow
            if native and not classes:
                raise NeedsTrustError(
                    "loading this file runs the native code it holds: " + ", ".join(native),
                    path=r.path,
                    hint="pass --trust if you trust its source",
                )
            needed = [c for c in classes if c not in allow] or native
            if not needed:  # no class to name (Python source): what the scan says of it
                why = "; ".join(f.reason for f in r.findings if f.severity == "needs-code")
                raise NeedsTrustError(why, path=r.path, hint="pass --trust if you trust it")
            raise NeedsTrustError(
                "loading this file imports Python code: " + ", ".join(needed),
                path=r.path,
                hint="pass --trust (or --allow for each class) if you trust its source and "
                "these classes are importable",
            )
    return results


def _refuse_code(path: Path, results: list[FileScan], trust: bool) -> None:
    """A folder's own code runs only under ``--trust-remote-code``: its files and the classes
    ``auto_map`` names, said once for the whole folder."""
    findings = [f for r in results for f in r.findings if is_code(f)]
    if not findings:
        return
    files = sorted({Path(f.member).name for f in findings if f.opcode == SOURCE})
    classes = sorted({f.global_name for f in findings if f.opcode == "auto_map" and f.global_name})
    said = []
    if classes:
        said.append("auto_map maps " + ", ".join(classes))
    if files:
        said.append("code files: " + ", ".join(files))
    raise NeedsTrustError(
        "this folder carries its own Python code, which runs when it is loaded ("
        + "; ".join(said)
        + ")",
        path=path if len(results) > 1 or path.is_dir() else results[0].path,
        hint="pass --trust-remote-code if you trust its source (transformers' "
        "trust_remote_code)" + ("; --trust does not run a folder's code" if trust else ""),
    )
