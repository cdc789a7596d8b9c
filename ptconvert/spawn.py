"""Processes ptconvert spawns (isolated runtimes, ``-j`` workers) never re-run the caller's
script.

multiprocessing's spawn starts the child by importing the parent's ``__main__`` again (by its
module name or its file): a pipeline written as a plain script, without an ``if __name__ ==
"__main__":`` guard, ran its whole pipeline once more in every runtime ptconvert started and the
child died. What ptconvert runs in a child is its own code, so the child is started as if the
parent had no main module.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

_MISSING = object()


@contextmanager
def without_main() -> Iterator[None]:
    """While it lasts, processes spawned (``Process.start``, a pool's first ``submit``) do not
    import the parent's ``__main__``."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {k: getattr(main, k, _MISSING) for k in ("__spec__", "__file__")}
    main.__spec__ = None
    if saved["__file__"] is not _MISSING:
        del main.__file__
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is not _MISSING:
                setattr(main, key, value)


def die_with_parent(parent: int) -> None:
    """In a child ptconvert started: be killed when the parent dies (Linux's parent-death
    signal), so that a parent that is killed leaves no loader spinning. Elsewhere, and if the
    parent is already gone, the child exits at once in the second case only."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the signal was asked for
        os._exit(1)
