"""The source scans of "a target is one package": outside ``ptconvert/formats/`` no code
compares a format's name or keys a table by format names (a target declares what it does on
its Format and in its package), and ``torch.export.export`` is called from one module only
(``convert/exporting.py``: every export option reaches every route)."""

from __future__ import annotations

import ast
from pathlib import Path

from ptconvert.formats import FORMATS

PACKAGE = Path(__file__).parent.parent / "ptconvert"


def _sources(outside: str | None = None) -> list[tuple[str, ast.AST]]:
    return [
        (str(p.relative_to(PACKAGE)), ast.parse(p.read_text()))
        for p in sorted(PACKAGE.rglob("*.py"))
        if outside is None or p.relative_to(PACKAGE).parts[0] != outside
    ]


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    return []


def test_no_format_name_is_compared_or_keys_a_table_outside_formats() -> None:
    names = {f.name for f in FORMATS}
    found = []
    for where, tree in _sources(outside="formats"):
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                said = [s for c in [node.left, *node.comparators] for s in _strings(c)]
                found += [f"{where}:{node.lineno} compares {s!r}" for s in said if s in names]
            if isinstance(node, ast.Dict):
                keys = [s for k in node.keys if k is not None for s in _strings(k)]
                if sum(k in names for k in keys) >= 2:
                    found.append(f"{where}:{node.lineno} a table keyed by {keys}")
    assert found == []


def test_the_scan_sees_a_comparison_and_a_table() -> None:
    """The scan above is not blind: both shapes it looks for are found in a sample."""
    sample = ast.parse('if to == "onnx": pass\nSTEPS = {"pt2": 1, "aoti": 2}\n')
    compares = [n for n in ast.walk(sample) if isinstance(n, ast.Compare)]
    tables = [n for n in ast.walk(sample) if isinstance(n, ast.Dict)]
    assert _strings(compares[0].comparators[0]) == ["onnx"]
    assert [s for k in tables[0].keys if k is not None for s in _strings(k)] == ["pt2", "aoti"]


def test_torch_export_export_is_called_from_one_module() -> None:
    callers = {
        where
        for where, tree in _sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "export"
        and ast.unparse(node.func.value) in ("torch.export", "export")
    }
    assert callers == {"convert/exporting.py"}
