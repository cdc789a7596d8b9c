"""Batch conversion: every model under a directory, in N local processes or as Ray tasks.

One conversion per model is ``ptconvert.convert`` run in a worker (a spawned process, or a Ray
task on any node of a cluster): each writes its output atomically, so shared storage never holds
half a file. The driver alone keeps the manifest (``.ptconvert-batch.json`` in the output
folder) that lets a re-run skip the outputs already complete and verified.
"""

from __future__ import annotations

import json
import os
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ptconvert import progress
from ptconvert.atomic import atomic_path, disk_size, sweep
from ptconvert.errors import InputError, PtconvertError, UsageError
from ptconvert.options import Options
from ptconvert.report import Report

MANIFEST = ".ptconvert-batch.json"
ItemStatus = Literal["converted", "skipped", "failed", "not-run"]
Executor = Literal["local", "ray"]


@dataclass
class BatchItem(Report):
    src: str  # relative to the batch's source folder
    output: str
    size: int  # bytes of the source (the progress bar's unit)
    status: ItemStatus = "not-run"
    check: str = "none"  # the conversion's check ("parity", "bitwise", "copy", "none")
    seconds: float = 0.0
    error: dict[str, Any] | None = None  # the error's to_dict(): type, exit_code, message, hint
    report: dict[str, Any] | None = None  # the conversion's report (its --json)
    worker: str | None = None  # the process (host:pid) that converted it


@dataclass
class BatchReport(Report):
    src: str
    out_dir: str
    to: str
    executor: str
    jobs: int
    items: list[BatchItem] = field(default_factory=list)
    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    # 0 when every model was converted or skipped as complete; else the exit code of the first
    # failure in the order of the files (the same whichever worker finished first)
    exit_code: int = 0


def is_batch(src: str | Path) -> bool:
    """A folder that is not itself one model (a Hugging Face directory is one)."""
    from ptconvert.formats import detect

    path = Path(src)
    if not path.is_dir():
        return False
    try:
        detect(path)
    except InputError:
        return True
    return False


def models_under(root: Path, skip: Path | None = None) -> list[Path]:
    """Every model under ``root`` in a stable order: a model directory (Hugging Face) as one,
    a sharded index for its shards, and each file ptconvert recognises. A file that carries a
    model suffix but cannot be recognised is listed too, so the batch reports it as broken.
    Symlinked folders are followed (each real folder once); ``skip`` (the outputs' folder)
    and hidden names are left out."""
    from ptconvert.formats import FORMATS, detect
    from ptconvert.formats.sharded import shard_paths

    suffixes = tuple(s for f in FORMATS for s in f.suffixes)
    skipped = skip.resolve() if skip is not None else None
    seen: set[Path] = set()
    found: list[Path] = []
    for dirpath, dirs, files in os.walk(root, followlinks=True):
        here = Path(dirpath)
        real = here.resolve()
        if real in seen or real == skipped:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if here != root and _is_model(here, detect):
            found.append(here)
            dirs[:] = []
            continue
        shards = {
            _real(p) for f in files if f.endswith(".index.json") for p in shard_paths(here / f)
        }
        for name in sorted(files):
            path = here / name
            resolved = _real(path)
            if name.startswith(".") or (resolved is not None and resolved in shards):
                continue
            # a link loop is listed too: its conversion says so (the rest converts)
            if resolved is None or _is_model(path, detect) or name.lower().endswith(suffixes):
                found.append(path)
    return found


def _real(path: Path) -> Path | None:
    """The path with every link resolved; None for a symbolic link loop."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # RuntimeError: Python < 3.13 says a loop so
        return None


def _is_model(path: Path, detect: Callable[[Path], Any]) -> bool:
    try:
        detect(path)
    except PtconvertError:
        return False
    return True


def output_names(
    sources: list[Path], root: Path, out_dir: Path, to: str, opts: Options
) -> list[Path]:
    """Each source's output under ``out_dir``, named and placed as a single conversion would
    put it beside the source; sources that would share a name keep their whole name."""
    from ptconvert.convert.output_naming import output_for

    outs = []
    for src in sources:
        beside = output_for(src, to, opts)
        inside = beside.is_relative_to(root) and beside != root
        outs.append(out_dir / (beside.relative_to(root) if inside else beside.name))
    clash = {o for o in outs if outs.count(o) > 1}
    return [
        o.with_name(f"{s.name}-{o.name}") if o in clash else o
        for s, o in zip(sources, outs, strict=True)
    ]


def convert_many(
    src_dir: str | Path,
    to: str,
    out_dir: str | Path,
    opts: Options,
    *,
    jobs: int = 1,
    keep_going: bool = False,
    executor: Executor = "local",
    ray_address: str | None = None,
    convert: Callable[..., Any],
) -> BatchReport:
    """Convert every model under ``src_dir`` to ``to`` into ``out_dir`` (the same layout).

    ``convert`` is the public ``ptconvert.convert`` (it reaches workers by reference and loads
    the plugins there, as every API call does)."""
    if jobs < 1:
        raise UsageError(f"-j {jobs}: the number of processes is 1 or more")
    if executor not in ("local", "ray"):
        raise UsageError(f"--executor {executor!r}: local or ray")
    root, out_root = Path(src_dir), Path(out_dir)
    if not root.is_dir():
        raise InputError("not a directory", path=root)
    if out_root.exists() and not out_root.is_dir():
        raise UsageError("the output of a batch is a directory", path=out_root)
    if out_root.resolve() == root.resolve():
        raise UsageError(
            "the outputs would go into the source folder, where the next run would take them "
            "for models",
            path=out_root,
            hint="choose another -o (a folder inside the source folder is left out of the search)",
        )
    started = time.perf_counter()
    with progress.step(f"finding the models under {root}"):
        sources = models_under(root, skip=out_root)
    if not sources:
        raise InputError(
            "no model under this folder (no file ptconvert recognises, no Hugging Face directory)",
            path=root,
        )
    outputs = output_names(sources, root, out_root, to, opts)
    manifest = _Manifest(out_root / MANIFEST)
    items: list[BatchItem] = []
    todo: list[_Task] = []
    with progress.bar(f"reading {len(sources)} models", len(sources)) as advance:
        for src, out in zip(sources, outputs, strict=True):
            item = BatchItem(str(src.relative_to(root)), str(out), _source_size(src))
            items.append(item)
            # what the output is a function of, read before the conversion starts
            key = output_key(src, to, out, opts)
            done = manifest.complete(item.src, key, out, to, opts.verify)
            advance()
            if done is not None:
                item.status, item.check = "skipped", done
                continue
            # an output this batch wrote (and nobody changed since) is replaced without --force
            ours = manifest.wrote(item.src, out, to)
            task_opts = replace(opts, force=opts.force or ours)
            todo.append(_Task(len(items) - 1, src, out, task_opts, key, label=item.src))
    report = BatchReport(str(root), str(out_root), to, executor, jobs, items)
    # on a terminal: a bar of the models done, and a line per model converting now (its name
    # and elapsed time; with -j 1 its steps under it, as a single conversion shows them)
    lines = _Lines()
    with (
        progress.bar(f"converting {len(todo)} models to {to}", len(todo)) as advance,
        _executor(executor, jobs, ray_address, lines) as submit,
    ):
        for task, result in _run(todo, to, convert, submit, jobs, keep_going, lines):
            item = items[task.index]
            _settle(item, result)
            if item.status == "converted":
                manifest.record(item.src, task.key, task.out, to, item.check)
            advance()
    for folder in {t.out.parent for t in todo}:  # what workers killed on their last try left
        sweep(folder)
    report.seconds = round(time.perf_counter() - started, 3)
    report.counts = {s: sum(1 for i in items if i.status == s) for s in _STATUSES}
    failed = [i for i in items if i.status == "failed"]
    report.exit_code = int(failed[0].error["exit_code"]) if failed and failed[0].error else 0
    return report


@dataclass
class _Task:
    index: int  # in the report's items
    src: Path
    out: Path
    opts: Options
    key: str | None  # cache.cache_key of the source, target and options; None: unreadable
    tries: int = 0
    label: str = ""  # the source as the report names it (relative to the batch's folder)


def output_key(src: Path, to: str, out: Path, opts: Options) -> str | None:
    """What determines the output (the cache's key: the bytes of every file the source loads
    from, the model's code, the options, the versions), or None when that cannot say it: a
    file not recognised, a pickle that imports classes of its own."""
    from ptconvert.convert.cache_key import cache_key
    from ptconvert.formats import detect

    try:
        key, covered = cache_key(detect(src), to, out, opts)
    except PtconvertError:
        return None
    # a whole pickled module: the classes it imports are not in the key, so never "complete"
    return None if covered.get("imports_code") else key


def _source_size(src: Path) -> int:
    """Bytes the conversion reads: a shard index counts its shards."""
    from ptconvert.formats.sharded import shard_paths

    shards = shard_paths(src) if src.name.endswith(".index.json") else []
    return disk_size(src) + sum(disk_size(s) for s in shards)


_STATUSES: tuple[ItemStatus, ...] = ("converted", "skipped", "failed", "not-run")


def _settle(item: BatchItem, result: dict[str, Any]) -> None:
    item.seconds = result["seconds"]
    if "error" in result:
        item.status, item.error = "failed", result["error"]
        return
    item.worker = result.get("worker")
    item.status, item.report = "converted", result["report"]
    item.check = str(result["report"].get("check", "none"))


def _run(
    todo: list[_Task],
    to: str,
    convert: Callable[..., Any],
    submit: Callable[..., Future[dict[str, Any]]],
    jobs: int,
    keep_going: bool,
    lines: _Lines,
) -> Iterator[tuple[_Task, dict[str, Any]]]:
    """Results as they finish, at most ``jobs`` at once; without ``keep_going`` nothing new
    starts after a failure (those already running finish). A model whose worker died is run
    once more, alone: a crash takes the models converted beside it down too, and the model that
    crashed would take them down again."""
    queue = list(todo)
    running: dict[Future[dict[str, Any]], _Task] = {}
    shown: dict[int, ExitStack] = {}  # each running model's line on the display, by task index
    stop = False
    try:
        while running or (queue and not stop):
            while queue and not stop and len(running) < jobs:
                retrying = any(t.tries > 1 for t in running.values())
                if retrying or (queue[0].tries and running):
                    break
                task = queue.pop(0)
                task.tries += 1
                line = shown[task.index] = ExitStack()
                again = " (again, alone: its worker died)" if task.tries > 1 else ""
                name = f"{task.label or task.src.name}{again}"
                lines.open(str(task.src), name, line.enter_context(progress.status(name)))
                args = (convert, str(task.src), to, str(task.out), task.opts)
                running[submit(convert_one, *args)] = task  # with -j 1 it runs here, now
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in finished:
                task = running.pop(fut)
                lines.close(str(task.src))
                shown.pop(task.index).close()
                try:
                    result = fut.result()
                except Exception as exc:  # the worker died (killed, out of memory, lost node)
                    if task.tries < 2:
                        queue.insert(0, task)
                        continue
                    result = _failure(exc, 0.0, worker=True)
                stop = stop or ("error" in result and not keep_going)
                yield task, result
    finally:
        for task in running.values():
            lines.close(str(task.src))
        for line in shown.values():
            line.close()


class _Lines:
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
        return _failure(exc, time.perf_counter() - started)
    seconds = round(time.perf_counter() - started, 3)
    return {"report": report.to_dict(), "seconds": seconds, "worker": _worker()}


def _worker() -> str:
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def _failure(exc: BaseException, seconds: float, *, worker: bool = False) -> dict[str, Any]:
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
def _executor(
    kind: Executor, jobs: int, address: str | None, lines: _Lines
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

    def __init__(self, jobs: int, lines: _Lines) -> None:
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
        setup = (self.jobs, is_verbose(), self.queue)
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


def _worker_setup(jobs: int, verbose: bool, queue: Any = None) -> None:
    """Each of ``jobs`` workers takes its share of the cores (torch would take them all), the
    driver's -v, and, where the driver shows progress, a reporter sending it the steps."""
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


def _outputs_stat(out: Path, to: str) -> list[Any]:
    """Names, sizes and mtimes of the output and its companion files (an ONNX model's data)."""
    from ptconvert.formats import FORMATS_BY_NAME

    target = FORMATS_BY_NAME.get(to)
    paths = [out, *(target.companions(out) if target else [])]
    files = [f for p in paths for f in (sorted(p.rglob("*")) if p.is_dir() else [p])]
    return [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files if f.is_file()]


class _Manifest:
    """What this output folder's batches wrote: per source, the key of what determined the
    output (``output_key``), the output's files as written, and the check that passed.
    Rewritten whole after each model, by the driver only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}
        try:
            data = json.loads(path.read_text())
            self.entries = dict(data.get("entries", {})) if data.get("version") == 2 else {}
        except (OSError, ValueError, AttributeError):
            pass  # no manifest (or an unreadable one): everything is converted again

    def complete(self, src: str, key: str | None, out: Path, to: str, verify: bool) -> str | None:
        """The check of a complete output of the same source and options, or None."""
        e = self.entries.get(src)
        if key is None or e is None or e["key"] != key or e["output"] != str(out):
            return None
        if not self._untouched(e, out, to):
            return None
        return str(e["check"]) if e["check"] != "none" or not verify else None

    def wrote(self, src: str, out: Path, to: str) -> bool:
        """Whether the file at ``out`` is the one this batch wrote (or nothing is there)."""
        e = self.entries.get(src)
        return (
            e is not None
            and e["output"] == str(out)
            and (not out.exists() or self._untouched(e, out, to))
        )

    def _untouched(self, e: dict[str, Any], out: Path, to: str) -> bool:
        return out.exists() and _outputs_stat(out, to) == e["files"]

    def record(self, src: str, key: str | None, out: Path, to: str, check: str) -> None:
        if key is None:
            return
        self.entries[src] = {
            "key": key,
            "output": str(out),
            "files": _outputs_stat(out, to),
            "check": check,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(self.path, replace=True) as tmp:  # the driver's own file
            tmp.write_text(json.dumps({"version": 2, "entries": self.entries}, indent=1))
