"""The CLI's progress display on the terminal: the reporter ``progress.py`` hands its steps,
bars and statuses to, drawn by rich on a duplicate of fd 2 (so that it keeps moving while
``quiet.quiet_torch`` silences fd 2), sized by its own terminal.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from rich.console import Console, ConsoleDimensions
from rich.markup import escape

from ptconvert.render_table import size_text


class _OwnConsole(Console):
    """A console on a descriptor of its own: sized by its own terminal, also while fd 2 (which
    rich asks otherwise, with stdin and stdout) is silenced or stdout is a pipe."""

    @property
    def size(self) -> ConsoleDimensions:
        if self._width is None:
            try:
                width, height = os.get_terminal_size(self.file.fileno())
            except (AttributeError, ValueError, OSError):  # not a terminal: as rich says
                pass
            else:
                if width:
                    return ConsoleDimensions(width, height or 25)
        return super().size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size


class TerminalProgress:
    """The CLI's progress reporter on stderr (stdout is the report's): one rich display whose
    lines are the steps running now, each with its name and elapsed time, and a bar where the
    work has a size (tensors written, batch sizes compared). Steps nest (a conversion's step,
    the comparison inside it): each is a line of the same display.

    The display writes to a duplicate of fd 2 taken when the reporter is made, and rich's
    refresh thread redraws it ten times a second: while ``quiet.quiet_torch`` points fd 2 at
    /dev/null (torch.export, the AOTInductor compile) third-party output is silenced and the
    spinner and the elapsed time keep moving. Nothing else is redirected through the display:
    what others write to sys.stdout/sys.stderr goes where it would go without it."""

    def __init__(self, fd: int = 2) -> None:
        self._file = os.fdopen(os.dup(fd), "w", encoding="utf-8", errors="replace")
        self._console: Console = _OwnConsole(file=self._file)
        self._live: Any = None
        self._depth = 0

    @contextmanager
    def _task(self, name: str, total: int | None, unit: str = "") -> Iterator[Any]:
        from rich.progress import (
            BarColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        if self._live is None:
            from rich.text import Text

            class SizedBar(BarColumn):  # a bar and a count only for work with a size
                def render(self, task: Any) -> Any:
                    return Text("") if task.total is None else super().render(task)

            class Count(TextColumn):
                def render(self, task: Any) -> Any:
                    if not task.total:
                        return Text("")
                    if task.fields.get("unit") == "B":
                        return Text(
                            f"{size_text(int(task.completed))}/{size_text(int(task.total))}"
                        )
                    return Text(f"{task.completed:.0f}/{task.total:.0f}")

            class Left(TimeRemainingColumn):  # the time left of work measured in bytes
                def render(self, task: Any) -> Any:
                    return super().render(task) if task.fields.get("unit") else Text("")

            self._live = Progress(
                SpinnerColumn(),
                TextColumn("[bold]{task.description}[/bold]"),
                SizedBar(),
                Count(""),
                TimeElapsedColumn(),
                Left(),
                transient=True,
                console=self._console,
                # others' output goes where it would without the display: a logging handler
                # made meanwhile keeps sys.stderr (fd 2: silenced by quiet_torch), not ours
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()
        self._depth += 1
        task = self._live.add_task(escape(name), total=total, unit=unit)
        try:
            yield task
        finally:
            self._live.remove_task(task)
            self._depth -= 1
            if self._depth == 0:
                self._live.stop()
                self._live = None

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        with self._task(name, None):
            yield

    @contextmanager
    def status(self, name: str) -> Iterator[Callable[[str], None]]:
        """A step whose line ``say(text)`` renames (from any thread: rich locks its tasks)."""
        with self._task(name, None) as task:
            live = self._live

            def say(text: str) -> None:
                with suppress(KeyError):  # the step ended meanwhile
                    live.update(task, description=escape(text))

            yield say

    @contextmanager
    def bar(self, name: str, total: int, unit: str = "") -> Iterator[Callable[..., None]]:
        with self._task(name, total, unit) as task:
            yield lambda amount=1: self._live.advance(task, amount)
