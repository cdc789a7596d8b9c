"""Keep torch's own logging and warnings off the terminal while a converter tries a route.

A failing torch.export attempt logs whole graphs; ptconvert reports the failure itself (the
first line of the error, in the step record) and moves on to the next route.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet_torch() -> Iterator[None]:
    loggers = [
        logging.getLogger(n) for n in ("torch", "torch._dynamo", "torch.export", "torch._export")
    ]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
