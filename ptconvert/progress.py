"""Progress on a terminal: rich spinners on stderr, silent under --json or when not a tty."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_quiet = False


def set_quiet(quiet: bool) -> None:
    """Silence progress for this process (the CLI calls it for --json)."""
    global _quiet
    _quiet = quiet


def enabled() -> bool:
    return not _quiet and sys.stderr.isatty()


@contextmanager
def step(name: str) -> Iterator[None]:
    """Show a spinner named after the step while it runs."""
    if not enabled():
        yield
        return
    with _console().status(f"[bold]{name}[/bold]…"):
        yield


@contextmanager
def bar(name: str, total: int) -> Iterator[Callable[[], None]]:
    """A progress bar named after the step; yields the function that advances it by one."""
    if not enabled() or total < 2:
        yield lambda: None
        return
    from rich.progress import Progress

    with Progress(transient=True, console=_console()) as prog:
        task = prog.add_task(name, total=total)
        yield lambda: prog.advance(task)


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True)
