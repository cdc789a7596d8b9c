"""Keep third-party chatter off the terminal: torch's logging while a converter tries a route,
and the warnings, logs and progress bars of the libraries ptconvert drives (-v shows them all).

A failing torch.export attempt logs whole graphs; ptconvert reports the failure itself (the
first line of the error and the user's source line, in the step record) and moves on to the
next route. File descriptor 2 itself is silenced: torch configures handlers on loggers it
creates while exporting, and draft_export collects its report from those log records, so muting
loggers would either miss some or empty the report. Only fd 2 is: the progress display writes
to a descriptor of its own (``render_progress.TerminalProgress``), so it keeps ticking meanwhile.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ptconvert._compat import hf

_verbose = False
# a library user's -v: read on every call, and inherited by the processes ptconvert spawns
VERBOSE_ENV = "PTCONVERT_VERBOSE"


def set_verbose(verbose: bool) -> None:
    """``-v``: let torch's own logging and warnings through (quiet_torch does nothing)."""
    global _verbose
    _verbose = verbose


def is_verbose() -> bool:
    """``-v`` (``set_verbose``), or ``PTCONVERT_VERBOSE`` set to anything but "" and "0"."""
    return _verbose or os.environ.get(VERBOSE_ENV, "") not in ("", "0")


@contextmanager
def quiet_torch() -> Iterator[None]:
    if is_verbose():
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


# read by transformers (and huggingface_hub) when first imported, and by the processes
# ptconvert spawns (the isolated runtimes, a folder's workers); a value the user set is kept
_QUIET_ENV = {
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "PYTHONWARNINGS": "ignore",
}


# Python loggers that speak when another library imports their package: torchao (which the
# executorch extra installs, and transformers imports whenever it is there) on the native
# kernels it cannot load here, and torch's pytree on the enums torchao registers
_QUIET_LOGGERS = ("torchao", "torch.utils._pytree")


@contextmanager
def quiet_libraries() -> Iterator[None]:
    """The CLI's whole run, and each API call, without the libraries' own warnings
    (FutureWarnings, torch's UserWarnings), transformers' logs (load reports, config advice)
    and progress bars: what reaches the terminal is ptconvert's. Everything as it was after;
    nothing changed with -v or PTCONVERT_VERBOSE=1. Nested calls (the CLI's run around an API
    call) keep the outermost's state to restore. Python's warning filters are one per process
    (before 3.14): an API call in one thread silences another thread's warnings meanwhile."""
    if is_verbose():
        yield
        return
    env = {k: os.environ.get(k) for k in _QUIET_ENV}
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)
    hf_logging = _transformers_logging()  # imported already: its level is set, not read
    level = hf_logging.get_verbosity() if hf_logging is not None else None
    if hf_logging is not None:
        hf_logging.set_verbosity_error()
    loggers = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.level, logging.ERROR))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, before in zip(loggers, levels, strict=True):
            logger.setLevel(before)
        for key, old in env.items():
            if old is None:
                os.environ.pop(key, None)
        hf_logging = _transformers_logging()
        if hf_logging is not None:  # as it was, or as its environment says (imported since)
            default = level if level is not None else hf.default_logging_level(hf_logging)
            hf_logging.set_verbosity(default)


def _transformers_logging() -> Any:
    """``transformers.utils.logging`` when transformers is imported (never imported here)."""
    transformers: Any = sys.modules.get("transformers")
    logging = getattr(getattr(transformers, "utils", None), "logging", None)
    return logging if hasattr(logging, "set_verbosity_error") else None


def onnxruntime_quiet(options: Any) -> Any:
    """``options`` (an onnxruntime ``SessionOptions``) set to log errors only, unless -v: the
    session's warnings ("Could not find a CPU kernel …", in colour) are not the user's."""
    if not is_verbose():
        options.log_severity_level = 3
    return options
