"""Keep torch's own logging and warnings off the terminal while a converter tries a route.

A failing torch.export attempt logs whole graphs; ptconvert reports the failure itself (the
first line of the error and the user's source line, in the step record) and moves on to the
next route. File descriptor 2 itself is silenced: torch configures handlers on loggers it
creates while exporting, and draft_export collects its report from those log records, so muting
loggers would either miss some or empty the report. Progress on the terminal pauses meanwhile.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

_verbose = False


def set_verbose(verbose: bool) -> None:
    """``-v``: let torch's own logging and warnings through (quiet_torch does nothing)."""
    global _verbose
    _verbose = verbose


def is_verbose() -> bool:
    return _verbose


@contextmanager
def quiet_torch() -> Iterator[None]:
    if _verbose:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
