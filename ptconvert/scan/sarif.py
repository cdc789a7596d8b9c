"""A scan report as SARIF 2.1.0, the log CI code scanning reads (GitHub's upload-sarif).

One rule per kind of finding, one result per finding, located at the file (relative to the
current directory, the checkout CI runs in, where the file is below it: ``%SRCROOT%``); the
archive member, opcode and offset are in the message and the result's properties.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ptconvert.scan.analysis import Finding
from ptconvert.scan.code_files import SOURCE

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
# rule id → (level, short description, what it means for loading the file)
RULES: dict[str, tuple[str, str, str]] = {
    "dangerous": (
        "error",
        "Loading this file runs code",
        "A pickle imports or calls something that can run code when the file is loaded. "
        "Do not load it.",
    ),
    "needs-code": (
        "warning",
        "Loading this file needs classes outside the allowlist",
        "The pickle builds classes that are not on the allowlist (a whole pickled module, a "
        "user class): loading it imports and runs their code. Review, then --trust or --allow.",
    ),
    "remote-code": (
        "warning",
        "The folder's own Python code runs when it is loaded",
        "A config's auto_map names Python files of the folder that transformers imports "
        "under trust_remote_code. Review, then --trust-remote-code.",
    ),
    "native-code": (
        "warning",
        "Loading this file runs native code",
        "The archive holds a shared library that loading it runs. Review, then --trust.",
    ),
    "unreadable": (
        "error",
        "The scan cannot read this file completely",
        "Part of the file cannot be read as its loader would read it, so it is refused.",
    ),
}


def rule_of(f: Finding) -> str:
    if f.severity == "error":
        return "unreadable"
    if f.opcode in ("auto_map", SOURCE):
        return "remote-code"
    if f.severity == "needs-code" and "native code" in f.reason:
        return "native-code"
    return f.severity  # "dangerous" | "needs-code"


def sarif(report: Any) -> dict[str, Any]:
    """The SARIF log of a ``ScanReport``."""
    from ptconvert.deps import VERSION

    ids = list(RULES)
    base = Path.cwd()
    results = []
    for file in report.files:
        uri, based = _uri(Path(file.path), base)
        location: dict[str, Any] = {"uri": uri, **({"uriBaseId": "%SRCROOT%"} if based else {})}
        for f in file.findings:
            rule = rule_of(f)
            where = f"{f.opcode} @ {f.offset} in {f.member}" if f.opcode != "-" else f.member
            text = f"{f.global_name}: {f.reason}" if f.global_name else f.reason
            results.append(
                {
                    "ruleId": rule,
                    "ruleIndex": ids.index(rule),
                    "level": RULES[rule][0],
                    "message": {"text": f"{text} ({where})"},
                    "locations": [{"physicalLocation": {"artifactLocation": location}}],
                    "properties": {
                        "severity": f.severity,
                        "member": f.member,
                        "opcode": f.opcode,
                        "offset": f.offset,
                        **({"global": f.global_name} if f.global_name else {}),
                    },
                }
            )
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "ptconvert",
                "version": VERSION,
                "rules": [_rule(i) for i in ids],
            }
        },
        "originalUriBaseIds": {"%SRCROOT%": {"uri": base.as_uri() + "/"}},
        "results": results,
        "properties": {"verdict": report.verdict, "skipped": len(report.skipped)},
    }
    return {"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}


def _rule(rule: str) -> dict[str, Any]:
    level, short, full = RULES[rule]
    return {
        "id": rule,
        "name": "".join(w.capitalize() for w in rule.split("-")),
        "shortDescription": {"text": short},
        "fullDescription": {"text": full},
        "defaultConfiguration": {"level": level},
        "help": {"text": full},
    }


def _uri(path: Path, base: Path) -> tuple[str, bool]:
    """A file's URI: relative to ``base`` (with ``/``) where it lies below it, else absolute."""
    absolute = Path(os.path.abspath(path))
    try:
        return quote(absolute.relative_to(base).as_posix()), True
    except ValueError:
        return absolute.as_uri(), False
