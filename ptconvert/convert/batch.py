"""Batch conversion: every model under a directory, in N local processes or as Ray tasks.

One conversion per model is ``ptconvert.convert`` run in a worker (a spawned process, or a Ray
task on any node of a cluster): each writes its output atomically, so shared storage never holds
half a file. The driver alone keeps the manifest (``.ptconvert-batch.json`` in the output
folder) that lets a re-run skip the outputs already complete and verified.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ptconvert import progress
from ptconvert.atomic import atomic_path
from ptconvert.errors import InputError, PtconvertError, UsageError
from ptconvert.options import Options
from ptconvert.report import Report, to_jsonable

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
    model suffix but cannot be recognised is listed too, so the batch reports it as broken."""
    from ptconvert.formats import FORMATS, detect

    suffixes = tuple(s for f in FORMATS for s in f.suffixes)
    found: list[Path] = []
    for dirpath, dirs, files in os.walk(root):
        here = Path(dirpath)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and here / d != skip)
        if here != root and _is_model(here, detect):
            found.append(here)
            dirs[:] = []
            continue
        shards = _shards_listed(here, files)
        for name in sorted(files):
            path = here / name
            if name.startswith(".") or name in shards:
                continue
            if _is_model(path, detect) or name.lower().endswith(suffixes):
                found.append(path)
    return found


def _is_model(path: Path, detect: Callable[[Path], Any]) -> bool:
    try:
        detect(path)
    except PtconvertError:
        return False
    return True


def _shards_listed(folder: Path, files: list[str]) -> set[str]:
    """The shard files that a sharded index in ``folder`` names (converted through the index)."""
    listed: set[str] = set()
    for name in files:
        if name.endswith(".index.json"):
            try:
                weight_map = json.loads((folder / name).read_text()).get("weight_map", {})
                listed |= {str(v) for v in weight_map.values()}
            except (OSError, ValueError, AttributeError):
                continue  # a broken index is listed as a model and fails there, named
    return listed


def output_names(
    sources: list[Path], root: Path, out_dir: Path, to: str, opts: Options
) -> list[Path]:
    """Each source's output under ``out_dir``, named and placed as a single conversion would
    put it beside the source; sources that would share a name keep their whole name."""
    from ptconvert.convert.engine import output_for

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
    started = time.perf_counter()
    with progress.step(f"finding the models under {root}"):
        sources = models_under(root, skip=out_root.resolve() if out_root.exists() else out_root)
    if not sources:
        raise InputError(
            "no model under this folder (no file ptconvert recognises, no Hugging Face directory)",
            path=root,
        )
    outputs = output_names(sources, root, out_root, to, opts)
    manifest = _Manifest(out_root / MANIFEST)
    digest = _options_digest(to, opts)
    items: list[BatchItem] = []
    todo: list[tuple[int, Path, Path, Options]] = []
    for src, out in zip(sources, outputs, strict=True):
        item = BatchItem(str(src.relative_to(root)), str(out), _size(src))
        items.append(item)
        done = manifest.complete(item.src, _fingerprint(src), digest, out, opts.verify)
        if done is not None:
            item.status, item.check = "skipped", done
            continue
        # an output this batch wrote before (from older bytes or options) is replaced
        ours = manifest.wrote(item.src, out)
        todo.append((len(items) - 1, src, out, replace(opts, force=opts.force or ours)))
    report = BatchReport(str(root), str(out_root), to, executor, jobs, items)
    total = sum(items[i].size for i, *_ in todo)
    with (
        progress.bar(f"converting {len(todo)} models to {to}", total, unit="B") as advance,
        _executor(executor, jobs, ray_address) as submit,
    ):
        for index, result in _run(todo, to, convert, submit, jobs, keep_going):
            item = items[index]
            _settle(item, result)
            if item.status == "converted":
                src = root / item.src
                manifest.record(item.src, _fingerprint(src), digest, Path(item.output), item)
            advance(item.size)
    report.seconds = round(time.perf_counter() - started, 3)
    report.counts = {s: sum(1 for i in items if i.status == s) for s in _STATUSES}
    failed = [i for i in items if i.status == "failed"]
    report.exit_code = int(failed[0].error["exit_code"]) if failed and failed[0].error else 0
    return report


_STATUSES: tuple[ItemStatus, ...] = ("converted", "skipped", "failed", "not-run")


def _settle(item: BatchItem, result: dict[str, Any]) -> None:
    item.seconds = result["seconds"]
    if "error" in result:
        item.status, item.error = "failed", result["error"]
        return
    item.status, item.report = "converted", result["report"]
    item.check = str(result["report"].get("check", "none"))


def _run(
    todo: list[tuple[int, Path, Path, Options]],
    to: str,
    convert: Callable[..., Any],
    submit: Callable[..., Future[dict[str, Any]]],
    jobs: int,
    keep_going: bool,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Results as they finish, at most ``jobs`` at once; without ``keep_going`` nothing new
    starts after a failure (those already running finish)."""
    queue = list(todo)
    running: dict[Future[dict[str, Any]], int] = {}
    stop = False
    while running or (queue and not stop):
        while queue and not stop and len(running) < jobs:
            index, src, out, opts = queue.pop(0)
            running[submit(convert_one, convert, str(src), to, str(out), opts)] = index
        finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
        for fut in finished:
            index = running.pop(fut)
            try:
                result = fut.result()
            except Exception as exc:  # the worker itself died (killed, out of memory, lost node)
                result = _failure(exc, 0.0, worker=True)
            stop = stop or ("error" in result and not keep_going)
            yield index, result


def convert_one(
    convert: Callable[..., Any], src: str, to: str, output: str, opts: Options
) -> dict[str, Any]:
    """One conversion in a worker; the result is plain data (it crosses processes and nodes)."""
    started = time.perf_counter()
    try:
        report = convert(src, to, output, opts)  # its folder is made when it writes
    except Exception as exc:
        return _failure(exc, time.perf_counter() - started)
    return {"report": report.to_dict(), "seconds": round(time.perf_counter() - started, 3)}


def _failure(exc: BaseException, seconds: float, *, worker: bool = False) -> dict[str, Any]:
    if isinstance(exc, PtconvertError):
        error = exc.to_dict()
    else:  # a bug or a dead worker: said plainly, with where it happened
        where = "the worker process died" if worker else "internal error"
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
def _executor(kind: Executor, jobs: int, address: str | None) -> Iterator[Callable[..., Future]]:
    """``submit(fn, *args) -> Future``: spawned local processes, or Ray tasks."""
    if kind == "ray":
        with _ray(jobs, address) as submit:
            yield submit
        return
    if jobs == 1:  # one at a time: in this process, as `ptconvert SRC --to` would
        yield _here
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn, not fork: torch's threads and the driver's state do not survive a fork
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        jobs, mp_context=context, initializer=_share_cores, initargs=(jobs,)
    ) as pool:
        yield pool.submit


def _here(fn: Callable[..., dict[str, Any]], *args: Any) -> Future[dict[str, Any]]:
    done: Future[dict[str, Any]] = Future()
    done.set_result(fn(*args))
    return done


def _share_cores(jobs: int) -> None:
    """Each of ``jobs`` workers takes its share of the cores (torch would take them all)."""
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // jobs))


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


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def _fingerprint(path: Path) -> list[Any]:
    """What a re-run compares to see that a source is unchanged: names, sizes, mtimes."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return [
        [str(p.relative_to(path)) if path.is_dir() else "", p.stat().st_size, p.stat().st_mtime_ns]
        for p in files
    ]


def _options_digest(to: str, opts: Options) -> str:
    """The options that shape the output (not --force, which only says it may be replaced)."""
    shaping = {k: v for k, v in to_jsonable(opts).items() if k not in ("force", "force_memory")}
    text = json.dumps({"to": to, **shaping}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class _Manifest:
    """What this output folder's batches wrote: per source, its fingerprint, the options, the
    output's size and mtime, and the check that passed. Rewritten whole after each model."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}
        try:
            data = json.loads(path.read_text())
            self.entries = dict(data.get("entries", {})) if data.get("version") == 1 else {}
        except (OSError, ValueError, AttributeError):
            pass  # no manifest (or an unreadable one): everything is converted again

    def complete(
        self, src: str, fingerprint: list[Any], digest: str, out: Path, verify: bool
    ) -> str | None:
        """The check of a complete output of the same source and options, or None."""
        e = self.entries.get(src)
        if e is None or e["fingerprint"] != fingerprint or e["options"] != digest:
            return None
        if not out.exists() or _fingerprint(out) != e["output_stat"]:
            return None
        return str(e["check"]) if e["check"] != "none" or not verify else None

    def wrote(self, src: str, out: Path) -> bool:
        e = self.entries.get(src)
        return e is not None and e["output"] == str(out)

    def record(
        self, src: str, fingerprint: list[Any], digest: str, out: Path, item: BatchItem
    ) -> None:
        self.entries[src] = {
            "fingerprint": fingerprint,
            "options": digest,
            "output": str(out),
            "output_stat": _fingerprint(out),
            "check": item.check,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(self.path) as tmp:
            tmp.write_text(json.dumps({"version": 1, "entries": self.entries}, indent=1))
