"""The table every report is printed as, and the text of its cells.

``Grid``: a table laid out for the width it is printed at (numbers never cut; too wide: text
columns wrapped, then stacked parts with the key columns again). The cells' text: sizes in binary
units, measured errors in three significant digits, an output's pytree path as a name. What each
report's tables hold is ``render.py``'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions
from rich.table import Table
from rich.text import Text


def size_text(n: int) -> str:
    """A byte count in binary units (``512 B``, ``1.5 MiB``)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def error_text(value: float) -> str:
    """A measured error in three significant digits (``6.01e-05``, ``0.0120``, ``0``)."""
    return f"{value:#.3g}" if value else "0"


_KEY_PART = re.compile(r"\['((?:[^'\\]|\\.)*)'\]|\[(\d+)\]|\.(\w+)")


def leaf_name(path: str) -> str:
    """An output's pytree path as a name: ``['past'][0]`` → ``past.0``, ``[1]`` → ``1``."""
    parts, at = [], 0
    for m in _KEY_PART.finditer(path):
        if m.start() != at:
            return path
        parts.append(next(g for g in m.groups() if g is not None))
        at = m.end()
    return ".".join(parts) if parts and at == len(path) else path


def _path_lines(cell: Text, width: int) -> Text:
    """A path cell broken into lines after a ``/`` to fit ``width``."""
    if cell_len(cell.plain) <= width:
        return cell
    lines = [""]
    for part in re.findall(r"[^/]*/|[^/]+$", cell.plain):
        if lines[-1] and cell_len(lines[-1] + part) > width:
            lines.append("")
        lines[-1] += part
    return Text("\n".join(lines), style=cell.style)


class Grid:
    """A table laid out for the width it is printed at, whose numbers are never cut: one table
    when its columns fit; else its text columns wrapped (a word longer than the column folds,
    nothing is left out); else stacked: the other columns in groups, one table under another,
    each with the first ``keys`` columns again, whole. ``fixed`` columns (numbers, statuses,
    dates) are never wrapped; their headers wrap at spaces when that makes the table fit.
    ``paths`` columns hold file paths: wrapped after a ``/`` (a name longer than the column
    folds)."""

    _TEXT_MIN = 12  # a text column is not wrapped narrower than this (or its longest header word)

    def __init__(
        self, *headers: str, fixed: tuple[int, ...] = (), keys: int = 1, paths: tuple[int, ...] = ()
    ) -> None:
        self.headers, self.fixed, self.keys = list(headers), set(fixed), keys
        self.paths = set(paths)
        self.rows: list[list[Text]] = []

    def add_row(self, *cells: str) -> None:
        """Cells in rich markup (data escaped by the caller)."""
        self.rows.append([Text.from_markup(c) for c in cells])

    def _widths(self, i: int) -> tuple[int, int]:
        """Column ``i``'s narrowest and natural widths (cell text, without padding): a key
        column's is its natural one."""
        header = self.headers[i]
        lines = [line for row in self.rows for line in row[i].plain.splitlines()] or [""]
        widest = max(cell_len(line) for line in lines)
        natural = max(widest, cell_len(header))
        word = max(cell_len(w) for w in header.split() or [""])
        if i < self.keys:
            return natural, natural
        if i in self.fixed:
            return max(widest, word), natural
        return max(word, min(natural, self._TEXT_MIN)), natural

    @staticmethod
    def _outer(columns: int) -> int:
        return max(2 * columns - 2, 0)  # two spaces between columns, none around

    def _layout(self, columns: list[int], width: int) -> list[int] | None:
        """Widths of ``columns`` in one table at most ``width`` wide, or None."""
        ranges = {i: self._widths(i) for i in columns}
        widths = {i: ranges[i][0] for i in columns}
        room = width - self._outer(len(columns)) - sum(widths.values())
        if room < 0:
            return None
        # what is left widens the text columns first, then unwraps fixed columns' headers
        for group in ([i for i in columns if i not in self.fixed], columns):
            while room > 0:
                short = [i for i in group if widths[i] < ranges[i][1]]
                if not short:
                    break
                for i in short[:room]:
                    widths[i] += 1
                room -= min(len(short), room)
        return [widths[i] for i in columns]

    def _table(self, columns: list[int], widths: list[int]) -> Table:
        t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
        for i, w in zip(columns, widths, strict=True):
            t.add_column(self.headers[i], width=w, overflow="fold")  # fixed: as wide as cells
        for row in self.rows:
            t.add_row(
                *(
                    _path_lines(row[i], w) if i in self.paths else row[i]
                    for i, w in zip(columns, widths, strict=True)
                )
            )
        return t

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Any]:
        width = options.max_width
        every = list(range(len(self.headers)))
        widths = self._layout(every, width)
        if widths is not None:
            yield self._table(every, widths)
            return
        keys = every[: self.keys]
        groups: list[list[int]] = [[]]  # stacked: as many columns a table as fit
        for i in every[self.keys :]:
            if groups[-1] and self._layout([*keys, *groups[-1], i], width) is None:
                groups.append([])
            groups[-1].append(i)
        for n, group in enumerate(groups):  # a column too wide alone: at its narrowest
            if n:
                yield Text("")
            columns = [*keys, *group]
            narrowest = [self._widths(i)[0] for i in columns]
            yield self._table(columns, self._layout(columns, width) or narrowest)
