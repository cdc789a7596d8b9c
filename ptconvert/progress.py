"""Progress of long work, through a reporter the caller installs (the CLI: rich on a terminal).

The library itself draws nothing: ``step`` and ``bar`` do nothing until ``set_reporter`` installs
one, so pipelines stay silent and the core never imports a terminal library. The CLI installs its
rich reporter when stderr is a terminal and removes it under ``--json``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol


class Reporter(Protocol):
    def step(self, name: str) -> AbstractContextManager[None]:
        """Shown while the step named ``name`` runs."""
        ...

    def bar(
        self, name: str, total: int, unit: str = ""
    ) -> AbstractContextManager[Callable[..., None]]:
        """A bar of ``total`` parts (``unit`` "B": bytes, shown as sizes with the time left);
        the context gives ``advance(amount=1)``."""
        ...


_reporter: Reporter | None = None


def set_reporter(reporter: Reporter | None) -> None:
    """Install (or with None, remove) the reporter of this process."""
    global _reporter
    _reporter = reporter


def set_quiet(quiet: bool) -> None:
    """Remove the reporter when ``quiet`` (the CLI calls it for --json)."""
    if quiet:
        set_reporter(None)


@contextmanager
def step(name: str) -> Iterator[None]:
    """Report the step while it runs."""
    if _reporter is None:
        yield
        return
    with _reporter.step(name):
        yield


def active() -> bool:
    """Whether a reporter is installed (something is shown)."""
    return _reporter is not None


@contextmanager
def status(name: str) -> Iterator[Callable[[str], None]]:
    """A step whose line can be renamed while it runs: yields ``say(text)`` (a batch's line of
    a model shows the step its worker reports). A reporter without ``status`` shows ``name``."""
    if _reporter is None:
        yield lambda text: None
        return
    own = getattr(_reporter, "status", None)
    if own is None:
        with _reporter.step(name):
            yield lambda text: None
        return
    with own(name) as say:
        yield say


@contextmanager
def bar(name: str, total: int, unit: str = "") -> Iterator[Callable[..., None]]:
    """A progress bar named after the step; yields ``advance(amount=1)``."""
    if _reporter is None or (total < 2 and not unit):
        yield lambda amount=1: None
        return
    with _reporter.bar(name, total, unit) as advance:
        yield advance
