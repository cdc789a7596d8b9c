"""The gate every load goes through: scan first, refuse what is not clearly safe to load."""

from __future__ import annotations

from pathlib import Path

from ptconvert.errors import CorruptFileError, NeedsTrustError, UnsafeInputError
from ptconvert.scan.scanner import FileScan, expand, scan_file


def guard(path: str | Path, *, trust: bool = False) -> list[FileScan]:
    """Scan ``path`` (a file or every file of a directory) before anything loads it.

    ``dangerous`` is refused (exit 10); a file the scan cannot read completely is refused as
    unreadable (exit 3); ``needs-code`` is refused unless ``trust`` (exit 11).
    """
    results = [scan_file(f) for f in expand([path])]
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
            if r.verdict == "needs-code":
                raise NeedsTrustError(
                    "loading this file imports Python code: " + ", ".join(r.classes or ["?"]),
                    path=r.path,
                    hint="pass --trust if you trust its source and these classes are importable",
                )
    return results
