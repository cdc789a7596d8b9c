"""Processes ptconvert spawns (isolated runtimes, ``-j`` workers, load probes) never re-run the
caller's script, and die with their parent.

multiprocessing's spawn starts the child by importing the parent's ``__main__`` again (by its
module name or its file): a pipeline written as a plain script, without an ``if __name__ ==
"__main__":`` guard, ran its whole pipeline once more in every runtime ptconvert started and the
child died. What ptconvert runs in a child is its own code, so the child is started as if the
parent had no main module.

A load probe (``probe``/``serve_probe``) loads a user file in a child first, within
``--load-timeout`` (and, for a trusted pickle, under the audit hook of scan/load_probe.py), so
that a load that never ends or runs code stops there, named, before this process loads it.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

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


def probe(
    target: Callable[..., None], args: tuple[Any, ...], *, path: Path, timeout: float, what: str
) -> None:
    """A load tried first in a spawned process: ``target(*args, send, parent_pid)`` (a module
    function that calls ``serve_probe``). Returns once that load finished within ``timeout``
    seconds (counted from when the child is ready: importing torch is not the file's doing);
    raises the child's named error, ``LoadTimeoutError`` (exit 3: the child is killed) or
    ``CorruptFileError`` (the child died)."""
    import multiprocessing as mp

    from ptconvert.errors import CorruptFileError, LoadTimeoutError

    ctx = mp.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(*args, send, os.getpid()), daemon=True)
    with without_main():
        proc.start()
    send.close()  # only the child holds its end: its death is an end of file here
    try:
        message = _next(receive, proc, _START_LIMIT_S, path, what)
        if message[0] == "ready":
            message = _next(receive, proc, timeout, path, what)
            if message is None:
                raise LoadTimeoutError(
                    f"{what} did not finish within {timeout:g} s (--load-timeout); it was "
                    "stopped and the file not loaded",
                    path=path,
                    hint="a larger --load-timeout if the file is large, else do not load it",
                )
        if message is None:
            raise CorruptFileError(f"the process trying {what} did not start", path=path)
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        receive.close()
    if message[0] == "error":
        _, kind, text, hint = message
        raise _error_class(kind)(text, path=path, hint=hint)


_START_LIMIT_S = 600.0  # seconds a probe may take to import what it loads with


def _next(receive: Any, proc: Any, limit: float, path: Path, what: str) -> Any:
    """The child's next message, None when none came within ``limit``."""
    from ptconvert.errors import CorruptFileError

    if not receive.poll(limit):
        return None
    try:
        return receive.recv()
    except EOFError:
        proc.join(5)
        raise CorruptFileError(
            f"{what} killed the process trying it (exit code {proc.exitcode}); the file was not "
            "loaded here",
            path=path,
        ) from None


def _error_class(kind: str) -> Any:
    from ptconvert import errors

    cls = getattr(errors, kind, None)
    ok = isinstance(cls, type) and issubclass(cls, errors.PtconvertError)
    return cls if ok else errors.CorruptFileError


def serve_probe(
    send: Any,
    parent: int,
    prepare: Callable[[], Any],
    load: Callable[[Any], Any],
    guard: Callable[[], AbstractContextManager[Any]] | None = None,
) -> None:
    """The probe's process: ``prepare()``, say ready, ``load`` what it prepared inside
    ``guard()`` (the audit hook) and let it be collected there, report, exit without teardown
    (nothing of the load runs after the report)."""
    import gc

    die_with_parent(parent)
    try:
        prepared = prepare()
        send.send(("ready",))
        with guard() if guard is not None else nullcontext():
            loaded = load(prepared)
            del loaded  # a __del__ of the file's objects runs inside the guard too
            gc.collect()
        send.send(("ok",))
    except BaseException as exc:
        from ptconvert.errors import PtconvertError

        if isinstance(exc, PtconvertError):
            send.send(("error", type(exc).__name__, exc.message, exc.hint))
        else:
            send.send(("error", "CorruptFileError", f"{type(exc).__name__}: {exc}"[:500], None))
    finally:
        send.close()
        os._exit(0)
