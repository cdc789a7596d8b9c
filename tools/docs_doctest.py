"""A griffe extension for `make docs` (mkdocs.yml): the API's docstrings show their ``>>>``
examples (which tests/test_docstrings.py runs) as Python console blocks, not as the nested
Markdown quotes ``>>>`` would otherwise make."""

from __future__ import annotations

from typing import Any

import griffe


def fenced(text: str) -> str:
    """Each run of doctest lines (from a ``>>>`` line to the next blank one) in a pycon fence."""
    out: list[str] = []
    indent: str | None = None  # the open fence's indentation
    for line in text.split("\n"):
        stripped = line.lstrip()
        if indent is None and stripped.startswith(">>>"):
            indent = line[: len(line) - len(stripped)]
            out.append(f"{indent}```pycon")
        elif indent is not None and not stripped:
            out.append(f"{indent}```")
            indent = None
        out.append(line)
    if indent is not None:
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fenced(obj.docstring.value)
