"""``ptconvert scan``: every pickle stream in every file judged against the allowlist."""

from __future__ import annotations

import errno
import fnmatch
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ptconvert import progress
from ptconvert.atomic import disk_size
from ptconvert.errors import InputError
from ptconvert.formats.base import Format
from ptconvert.pickles.allowlist import denied_reason
from ptconvert.pickles.machine import run_pickle
from ptconvert.pickles.records import Global, PickleRun
from ptconvert.pickles.torch_streams import acted, run_torch_pickles
from ptconvert.report import Report, Verdict
from ptconvert.scan.analysis import (
    NESTED_LOADER,
    SEVERITY_ORDER,
    Finding,
    analyse,
    nested_payload,
    verdict,
)
from ptconvert.scan.code_files import auto_map_findings, is_source, source_findings
from ptconvert.scan.containers import (
    FROM_BYTE_0,
    Problem,
    Stream,
    data_format,
    opens_as_archive,
    walk,
    walk_bytes,
    walk_source,
)


@dataclass
class FileScan(Report):
    path: str
    verdict: Verdict
    findings: list[Finding] = field(default_factory=list)
    pickles: int = 0
    notes: list[str] = field(default_factory=list)  # what the file is, where that matters
    # a loader reads it: a pickle ran, an archive or model format opened, code is imported, or
    # there is a finding; False: bytes no loader reads (a log, a README, a plain config)
    model: bool = True

    @property
    def classes(self) -> list[str]:
        """The user classes that must be importable to load the file (needs-code)."""
        return sorted(
            {f.global_name for f in self.findings if f.severity == "needs-code" and f.global_name}
        )


@dataclass
class ScanReport(Report):
    verdict: Verdict
    files: list[FileScan]
    counts: dict[str, int]
    notes: list[str] = field(default_factory=list)  # the snapshot a Hub id named
    skipped: list[str] = field(default_factory=list)  # files read that no loader reads


def scan_file(path: str | Path, allowed: frozenset[str] = frozenset()) -> FileScan:
    """Scan one file; never raises for bad content (that is an ``error`` verdict)."""
    path = Path(path)
    # Python source a loader imports is code; torch.load of the same bytes still unpickles
    # them from byte 0. Source nothing imports is read as the bytes it is, like any file.
    findings: list[Finding] = source_findings(path) if is_source(path) else []
    source = bool(findings)
    findings += auto_map_findings(path)
    pickles = 0
    notes: list[str] = []
    pending: list[tuple[str, bytes, int]] = []
    opened = False
    try:
        if not source and path.is_file():
            fmt = _data_format(path)  # a data file that holds no pickle says what it holds
            notes = fmt.scan_notes(path) if fmt is not None else []
            opened = fmt is not None or opens_as_archive(path)
        for item in _items(path, pending, source):
            if isinstance(item, Problem):
                findings.append(Finding(item.severity, item.label, 0, "-", None, item.reason))
                continue
            first = True
            for run in _runs(item):
                if isinstance(run, Finding):
                    findings.append(run)
                    continue
                if first and item.kind in _SNIFFED and run.error and not acted(run):
                    break  # not a pickle: the first one fails before any opcode could have acted
                first = False
                pickles += 1
                found = analyse(run, item.label, allowed, torchscript=item.torchscript)
                if item.kind == FROM_BYTE_0:
                    # where the bytes stop being opcodes the unpickler stops too (the run is
                    # fresh: it fails where CPython fails); what ran before is what counts
                    found = [f for f in found if f.severity != "error"]
                findings += found
                pending += _nested(run, item.label)
    except MemoryError:
        raise  # out of memory is the machine's state, not the file's: never "unreadable"
    except (OSError, InputError, ValueError) as exc:
        if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
            raise
        findings.append(Finding("error", str(path), 0, "-", None, f"cannot be read: {exc}"))
    model = opened or bool(findings or pickles or notes)
    return FileScan(str(path), verdict(findings), findings, pickles, notes, model)


def _data_format(path: Path) -> Format | None:
    with open(path, "rb") as fh:
        return data_format(fh.read(4096), path)


# Streams that may not be pickles at all: a first pickle that fails before doing anything is
# not one (a later one that fails is a parse error: the loader reads it whatever it holds).
_SNIFFED = frozenset({"maybe-pickle", FROM_BYTE_0})


def _items(
    path: Path, pending: list[tuple[str, bytes, int]], source: bool
) -> Iterable[Stream | Problem]:
    """The file's streams, then the torch.save bytes that its pickles load in turn."""
    yield from walk_source(path) if source else walk(path)
    while pending:
        label, data, depth = pending.pop()
        yield from walk_bytes(label, data, depth)


def _nested(run: PickleRun, label: str) -> list[tuple[str, bytes, int]]:
    depth = label.count("!") + 1
    out = []
    for e in run.events:
        func = e.target.func if e.kind == "call" else None
        if isinstance(func, Global) and f"{func.module}.{func.name}" == NESTED_LOADER:
            data = nested_payload(e.target)
            if data is not None:
                out.append((f"{label}!{NESTED_LOADER}@{e.offset}", data, depth))
    return out


def _runs(stream: Stream) -> Iterable[PickleRun | Finding]:
    if stream.kind in ("tar-storages", "tar-tensors"):
        yield from _tar_record_runs(stream)
        return
    runs = run_torch_pickles(stream.data, stream.start, fresh=stream.kind == FROM_BYTE_0)
    if not runs[0].joblib_arrays:
        yield from runs
        return
    # joblib's layout: joblib.load skips the array bytes after each wrapper, which pickle.load
    # and torch.load read as opcodes. The file is judged as joblib lays it out, and each stretch
    # of array bytes as a plain unpickler would run it from there: benign data fails at once
    # (the padding byte is no opcode), where a payload acts or parses through.
    laid_out = run_pickle(stream.data, stream.start, joblib=True)
    yield laid_out
    for region in laid_out.as_opcodes:
        if region.region == "object-array":
            yield from _outer_memo_imports(stream.label, region, laid_out)
            continue
        if region.error is None:
            why = "joblib array bytes parse as opcodes: pickle.load and torch.load run them"
            yield Finding("dangerous", stream.label, region.start, "-", None, why)
        yield replace(region, error=None)


def _outer_memo_imports(label: str, region: PickleRun, laid_out: PickleRun) -> list[Finding]:
    """Denied names that an object array's nested pickle imports only when pickle.load runs it
    inside the outer pickle (whose memo its GETs then read): joblib.load runs it on its own. Any
    other divergence is the garbage a plain reader makes of joblib's layout before it fails."""
    joblib_reads = {(g.module, g.name) for g in laid_out.imports}
    out = []
    for g in region.imports:
        why = denied_reason(g.module, g.name) if g.module and g.name else None
        if why and (g.module, g.name) not in joblib_reads:
            why += " (imported when pickle.load runs a joblib object array in the outer memo)"
            out.append(Finding("dangerous", label, g.offset, g.opcode, f"{g.module}.{g.name}", why))
    return out


def _tar_record_runs(stream: Stream) -> list[PickleRun]:
    from ptconvert.formats.checkpoint import tar_storages, tar_tensors

    data = bytes(stream.data)
    try:
        if stream.kind == "tar-storages":
            return tar_storages(data, Path(stream.label))[1]
        return tar_tensors(data, {}, Path(stream.label))[1]
    except (InputError, ValueError, TypeError, struct.error) as exc:
        text = exc.message if isinstance(exc, InputError) else str(exc)
        broken = PickleRun(0, 0, None, 0, [], f"legacy tar records: {text}")
        return [*_tar_records_run(data, stream.kind), broken]


def _tar_records_run(data: bytes, kind: str) -> list[PickleRun]:
    """The pickles torch's legacy tar loader runs in a ``storages`` or ``tensors`` member that
    the records reader refuses, in its order, up to where its reading stops: the count first
    (whatever it is), then each record while the layout holds."""
    from ptconvert.formats.torch_objects import STORAGE_DTYPES, global_name

    runs = [run_pickle(data)]
    count, pos = runs[0].root, runs[0].end
    if runs[0].error or not isinstance(count, int):
        return runs
    for _ in range(count):
        run = run_pickle(data, pos)
        runs.append(run)
        if run.error or not (isinstance(run.root, tuple) and len(run.root) == 3):
            return runs  # torch unpacks (key, location, type) / (key, storage, type) here
        try:
            if kind == "tar-storages":
                name = (global_name(run.root[2]) or "").rsplit(".", 1)[-1]
                (numel,) = struct.unpack_from("<q", data, run.end)
                pos = run.end + 8 + numel * STORAGE_DTYPES[name][1]
            else:
                (ndim,) = struct.unpack_from("<i", data, run.end)
                pos = run.end + 16 + 16 * ndim
        except (struct.error, KeyError):
            return runs
        if not 0 <= pos <= len(data):
            return runs
    if kind == "tar-storages" and pos < len(data):
        runs.append(run_pickle(data, pos))  # the storage views
    return runs


def expand(
    paths: Iterable[str | Path], include: Iterable[str] = (), exclude: Iterable[str] = ()
) -> list[Path]:
    """Files to scan: directories recursively, in a stable order, those ``include`` and
    ``exclude`` select; a shard index with the shards it names (loading the index loads them)."""
    out: list[Path] = []
    include, exclude = list(include), list(exclude)
    for p in map(Path, paths):
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs.sort()
                found = [Path(root) / f for f in sorted(files)]
                out += [f for f in found if _selected(f.relative_to(p), include, exclude)]
        elif p.exists():
            out += [p, *_shards_named(p)]
        else:
            raise InputError("no such file or directory", path=p)
    return list(dict.fromkeys(out))


def _selected(relative: Path, include: list[str], exclude: list[str]) -> bool:
    """Whether a file found in a folder is scanned: a glob matches its path below the folder
    (``*`` crosses ``/``) or its name."""

    def matches(globs: list[str]) -> bool:
        return any(
            fnmatch.fnmatch(str(relative), g) or fnmatch.fnmatch(relative.name, g) for g in globs
        )

    return (not include or matches(include)) and not matches(exclude)


def _shards_named(path: Path) -> list[Path]:
    if not path.name.endswith(".index.json"):
        return []
    from ptconvert.formats.sharded import shard_paths

    return shard_paths(path)  # not an index after all: none, scanned as the file it is


def scan(
    paths: Iterable[str | Path],
    *,
    allow: Iterable[str] = (),
    jobs: int = 1,
    include: Iterable[str] = (),
    exclude: Iterable[str] = (),
) -> ScanReport:
    """Scan files and directories (recursively, the files ``include``/``exclude`` select) with
    ``jobs`` processes. The report lists the files named and the files of a folder that a
    loader reads; the folders' other files are ``skipped``."""
    paths = list(paths)
    allowed = frozenset(allow)
    files = expand(paths, include, exclude)
    results: list[FileScan] = []
    sizes = [disk_size(f) for f in files]  # a dangling link is reported by its scan
    with progress.bar(f"scanning {len(files)} files", sum(sizes), unit="B") as advance:
        if jobs > 1 and len(files) > 1:
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(jobs) as pool:
                for r, size in zip(
                    pool.map(scan_file, files, [allowed] * len(files), chunksize=4),
                    sizes,
                    strict=True,
                ):
                    results.append(r)
                    advance(size)
        else:
            for f, size in zip(files, sizes, strict=True):
                results.append(scan_file(f, allowed))
                advance(size)
    # a file a folder holds is listed when a loader reads it; a file named is listed anyway
    named = {str(p) for p in map(Path, paths) if not p.is_dir()}
    skipped = [r.path for r in results if not r.model and r.path not in named]
    results = [r for r in results if r.model or r.path in named]
    counts: dict[str, int] = {k: sum(1 for r in results if r.verdict == k) for k in SEVERITY_ORDER}
    worst = max((SEVERITY_ORDER[r.verdict] for r in results), default=0)
    overall = next(k for k, v in SEVERITY_ORDER.items() if v == worst)
    return ScanReport(overall, results, counts, skipped=skipped)
