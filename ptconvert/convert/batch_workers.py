"""Where a batch's conversions run, and how their progress reaches the driver's display.

Each conversion is ``convert_one`` in a worker: the driver's process (-j 1), spawned local
processes, or Ray tasks on any node of a cluster; its result is plain data (it crosses processes
and nodes). A spawned worker's steps are relayed to the driver (``_Relay``), which shows the
innermost on the model's line (``Lines``).
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager, suppress
from typing import Any, Literal

from ptconvert import progress
from ptconvert.errors import PtconvertError
from ptconvert.options import Options

Executor = Literal["local", "ray"]


class Lines:
    """The display's line of each model running (by its source's path), renamed with the step
    its worker reports (``_Relay``): ``alpha.bin: exported → onnx``."""

    def __init__(self) -> None:
        self.says: dict[str, tuple[str, Callable[[str], None]]] = {}
        self.lock = threading.Lock()

    def open(self, src: str, name: str, say: Callable[[str], None]) -> None:
        with self.lock:
            self.says[src] = (name, say)

    def close(self, src: str) -> None:
        with self.lock:
            self.says.pop(src, None)

    def show(self, src: str, step: str) -> None:
        with self.lock:
            name, say = self.says.get(src, ("", None))
            if say is not None:
                say(f"{name}: {step}" if step else name)

    def listen(self, queue: Any) -> None:
        """The workers' events until None: (pid, "model" | "enter" | "exit", text)."""
        models: dict[int, str] = {}
        stacks: dict[int, list[str]] = {}
        while (event := queue.get()) is not None:
            pid, kind, text = event
            stack = stacks.setdefault(pid, [])
            if kind == "model":
                models[pid] = text
                stack.clear()
            elif kind == "enter":
                stack.append(text)
            elif stack:
                stack.pop()
            if pid in models:
                self.show(models[pid], stack[-1] if stack else "")


class _Relay:
    """A worker's progress reporter: its steps sent to the driver, which shows the innermost on
    the model's line (a worker has no terminal of its own)."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def send(self, kind: str, text: str) -> None:
        with suppress(Exception):  # the display is not worth a conversion
            self.queue.put_nowait((os.getpid(), kind, text))

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        self.send("enter", name)
        try:
            yield
        finally:
            self.send("exit", name)

    @contextmanager
    def bar(self, name: str, total: int, unit: str = "") -> Iterator[Callable[..., None]]:
        with self.step(name):
            yield lambda amount=1: None


_relay: _Relay | None = None  # in a worker whose driver shows progress


def convert_one(
    convert: Callable[..., Any], src: str, to: str, output: str, opts: Options
) -> dict[str, Any]:
    """One conversion in a worker; the result is plain data (it crosses processes and nodes)."""
    started = time.perf_counter()
    if _relay is not None:
        _relay.send("model", src)
    try:
        report = convert(src, to, output, opts)  # its folder is made when it writes
    except Exception as exc:
        return failure(exc, time.perf_counter() - started)
    seconds = round(time.perf_counter() - started, 3)
    return {"report": report.to_dict(), "seconds": seconds, "worker": _worker()}


def _worker() -> str:
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def failure(exc: BaseException, seconds: float, *, worker: bool = False) -> dict[str, Any]:
    """A failed conversion's result: its error as plain data (``worker``: the worker died)."""
    if isinstance(exc, PtconvertError):
        error = exc.to_dict()
    else:  # a bug or a dead worker: said plainly, with where it happened
        where = "the worker process died (twice)" if worker else "internal error"
        error = {
            "type": type(exc).__name__,
            "kind": "internal",
            "exit_code": 1,
            "path": None,
            "message": f"{where}: {type(exc).__name__}: {exc}",
            "hint": traceback.format_exception_only(exc)[-1].strip(),
        }
    return {"error": error, "seconds": round(seconds, 3)}


@contextmanager
def workers(
    kind: Executor, jobs: int, address: str | None, lines: Lines
) -> Iterator[Callable[..., Future]]:
    """``submit(fn, *args) -> Future``: spawned local processes (their steps shown on
    ``lines`` when progress is), or Ray tasks."""
    if kind == "ray":
        with _ray(jobs, address) as submit:
            yield submit
        return
    if jobs == 1:  # one at a time: in this process, as `ptconvert SRC --to` would
        yield _here
        return
    pool = _Processes(jobs, lines)
    try:
        yield pool.submit
    finally:
        pool.close()


class _Processes:
    """``jobs`` spawned worker processes (spawn, not fork: torch's threads and the driver's
    state do not survive a fork); a pool a dead worker broke is replaced at the next submit."""

    def __init__(self, jobs: int, lines: Lines) -> None:
        import multiprocessing

        self.jobs = jobs
        self.queue: Any = None
        self.listener: threading.Thread | None = None
        if progress.active():  # the workers' steps, shown on their models' lines
            self.queue = multiprocessing.get_context("spawn").Queue()
            self.listener = threading.Thread(target=lines.listen, args=(self.queue,), daemon=True)
            self.listener.start()
        self.pool = self._start()

    def _start(self) -> Any:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        from ptconvert.quiet import is_verbose

        context = multiprocessing.get_context("spawn")
        setup = (self.jobs, is_verbose(), self.queue, os.getpid())
        return ProcessPoolExecutor(
            self.jobs, mp_context=context, initializer=_worker_setup, initargs=setup
        )

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        from concurrent.futures.process import BrokenProcessPool

        from ptconvert.spawn import without_main

        with without_main():  # workers start on a submit: never with the caller's script
            try:
                return self.pool.submit(fn, *args)
            except BrokenProcessPool:
                self.pool.shutdown(wait=False, cancel_futures=True)
                self.pool = self._start()
                return self.pool.submit(fn, *args)

    def close(self) -> None:
        self.pool.shutdown()
        if self.queue is not None and self.listener is not None:
            self.queue.put(None)
            self.listener.join(2)


def _here(fn: Callable[..., dict[str, Any]], *args: Any) -> Future[dict[str, Any]]:
    done: Future[dict[str, Any]] = Future()
    done.set_result(fn(*args))
    return done


def _worker_setup(jobs: int, verbose: bool, queue: Any = None, parent: int | None = None) -> None:
    """Each of ``jobs`` workers dies with the driver (``parent``: a driver that is killed leaves
    no conversion running), takes its share of the cores (torch would take them all), the
    driver's -v, and, where the driver shows progress, a reporter sending it the steps."""
    if parent is not None:
        from ptconvert.spawn import die_with_parent

        die_with_parent(parent)
    import torch

    from ptconvert.quiet import set_verbose

    global _relay
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // jobs))
    set_verbose(verbose)
    if queue is not None:
        _relay = _Relay(queue)
        progress.set_reporter(_relay)


@contextmanager
def _ray(jobs: int, address: str | None) -> Iterator[Callable[..., Future]]:
    from ptconvert.deps import require

    ray = require("ray")
    address = address or os.environ.get("RAY_ADDRESS")
    started_here = not ray.is_initialized()
    if started_here:
        import logging

        extra: dict[str, Any] = {} if address else {"num_cpus": jobs}
        ray.init(
            address=address,
            logging_level=logging.WARNING,
            log_to_driver=False,
            include_dashboard=False,
            **extra,
        )
    remote = ray.remote(num_cpus=1, max_retries=0)(convert_one)
    try:
        yield lambda fn, *args: remote.remote(*args).future()
    finally:
        if started_here:
            ray.shutdown()
