"""``ptconvert scan``: every pickle stream in every file judged against the allowlist."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ptconvert import progress
from ptconvert.errors import InputError
from ptconvert.report import Report
from ptconvert.scan.analysis import SEVERITY_ORDER, Finding, analyse, verdict
from ptconvert.scan.containers import Problem, Stream, walk
from ptconvert.scan.machine import PickleRun, run_all_pickles, run_pickle

LEGACY_MAGIC = b"\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")
LEGACY_PICKLES = 5  # magic, protocol, sys_info, object, storage keys; raw storages follow


@dataclass
class FileScan(Report):
    path: str
    verdict: str  # "clean" | "needs-code" | "dangerous" | "error"
    findings: list[Finding] = field(default_factory=list)
    pickles: int = 0

    @property
    def classes(self) -> list[str]:
        """The user classes that must be importable to load the file (needs-code)."""
        return sorted(
            {f.global_name for f in self.findings if f.severity == "needs-code" and f.global_name}
        )


@dataclass
class ScanReport(Report):
    verdict: str
    files: list[FileScan]
    counts: dict[str, int]


def scan_file(path: str | Path, allowed: frozenset[str] = frozenset()) -> FileScan:
    """Scan one file; never raises for bad content (that is an ``error`` verdict)."""
    path = Path(path)
    findings: list[Finding] = []
    pickles = 0
    try:
        for item in walk(path):
            if isinstance(item, Problem):
                findings.append(Finding(item.severity, item.label, 0, "-", None, item.reason))
                continue
            for run in _runs(item):
                if item.kind == "maybe-pickle" and run.error and not _acts(run):
                    break  # not a pickle: it fails before any opcode could have acted
                pickles += 1
                findings += analyse(run, item.label, allowed, torchscript=item.torchscript)
    except (OSError, InputError, ValueError) as exc:
        findings.append(Finding("error", str(path), 0, "-", None, f"cannot be read: {exc}"))
    return FileScan(str(path), verdict(findings), findings, pickles)


def _acts(run: PickleRun) -> bool:
    """Whether the run reached an opcode that imports, calls or builds (an unpickler that failed
    before any of these ran nothing; a missing memo slot makes it fail on the spot)."""
    return any(e.kind in ("import", "call", "build") for e in run.events)


def _runs(stream: Stream) -> Iterable[PickleRun]:
    if stream.kind in ("tar-storages", "tar-tensors"):
        yield from _tar_record_runs(stream)
        return
    head = bytes(stream.data[stream.start : stream.start + 16])
    if stream.kind == "pickle" and LEGACY_MAGIC in head:
        pos = stream.start
        for _ in range(LEGACY_PICKLES):
            run = run_pickle(stream.data, pos)
            yield run
            if run.error:
                return
            pos = run.end
        return
    yield from run_all_pickles(stream.data, stream.start)


def _tar_record_runs(stream: Stream) -> list[PickleRun]:
    from ptconvert.formats.checkpoint import tar_storages, tar_tensors

    data = bytes(stream.data)
    try:
        if stream.kind == "tar-storages":
            return tar_storages(data, Path(stream.label))[1]
        return tar_tensors(data, {}, Path(stream.label))[1]
    except (InputError, ValueError, TypeError, struct.error) as exc:
        text = exc.message if isinstance(exc, InputError) else str(exc)
        return [PickleRun(0, 0, None, 0, [], f"legacy tar records: {text}")]


def expand(paths: Iterable[str | Path]) -> list[Path]:
    """Files to scan: directories recursively, in a stable order."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs.sort()
                out += [Path(root) / f for f in sorted(files)]
        elif p.exists():
            out.append(p)
        else:
            raise InputError("no such file or directory", path=p)
    return out


def scan(paths: Iterable[str | Path], *, allow: Iterable[str] = (), jobs: int = 1) -> ScanReport:
    """Scan files and directories (recursively) with ``jobs`` processes."""
    allowed = frozenset(allow)
    files = expand(paths)
    results: list[FileScan] = []
    with progress.bar("scanning", len(files)) as advance:
        if jobs > 1 and len(files) > 1:
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(jobs) as pool:
                for r in pool.map(scan_file, files, [allowed] * len(files), chunksize=4):
                    results.append(r)
                    advance()
        else:
            for f in files:
                results.append(scan_file(f, allowed))
                advance()
    counts = {k: sum(1 for r in results if r.verdict == k) for k in SEVERITY_ORDER}
    worst = max((SEVERITY_ORDER[r.verdict] for r in results), default=0)
    overall = next(k for k, v in SEVERITY_ORDER.items() if v == worst)
    return ScanReport(overall, results, counts)
