"""Batch conversion: every model under a directory, in N local processes or as Ray tasks.

One conversion per model is ``ptconvert.convert`` run in a worker (a spawned process, or a Ray
task on any node of a cluster): each writes its output atomically, so shared storage never holds
half a file. The driver alone keeps the manifest (``.ptconvert-batch.json`` in the output
folder) that lets a re-run skip the outputs already complete and verified.

The models found and their outputs' names are ``batch_discovery.py``'s, the manifest
``batch_manifest.py``'s, the workers and their progress ``batch_workers.py``'s; here the driver:
the models read, run at most -j at once, and the summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ptconvert import progress
from ptconvert.atomic import sweep
from ptconvert.convert.batch_discovery import models_under, output_names, source_size
from ptconvert.convert.batch_manifest import MANIFEST, Manifest, output_key
from ptconvert.convert.batch_workers import Executor, Lines, convert_one, failure, workers
from ptconvert.errors import InputError, UsageError
from ptconvert.options import Options
from ptconvert.report import Report

ItemStatus = Literal["converted", "skipped", "failed", "not-run"]


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
    manifest = Manifest(out_root / MANIFEST)
    items: list[BatchItem] = []
    todo: list[_Task] = []
    with progress.bar(f"reading {len(sources)} models", len(sources)) as advance:
        for src, out in zip(sources, outputs, strict=True):
            item = BatchItem(str(src.relative_to(root)), str(out), source_size(src))
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
    lines = Lines()
    with (
        progress.bar(f"converting {len(todo)} models to {to}", len(todo)) as advance,
        workers(executor, jobs, ray_address, lines) as submit,
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
    lines: Lines,
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
                    result = failure(exc, 0.0, worker=True)
                stop = stop or ("error" in result and not keep_going)
                yield task, result
    finally:
        for task in running.values():
            lines.close(str(task.src))
        for line in shown.values():
            line.close()
