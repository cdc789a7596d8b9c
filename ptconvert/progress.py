"""Progress on a terminal: rich spinners on stderr, silent under --json or when not a tty."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

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
    from rich.console import Console

    with Console(stderr=True).status(f"[bold]{name}[/bold]…"):
        yield
