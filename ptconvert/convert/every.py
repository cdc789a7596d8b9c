"""``--to all``: one model through every format the converter graph reaches from it.

Each target is a `convert` of the source (so each is verified as any conversion is), written
into one folder; the programs that pass are timed on the same inputs beside eager and
``torch.compile``. One table: format, route, size, check, latency against both.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, cast

from ptconvert import progress
from ptconvert.atomic import disk_size
from ptconvert.errors import (
    MissingRequirementError,
    PtconvertError,
    UnsupportedConversionError,
    UsageError,
)
from ptconvert.options import Options
from ptconvert.report import Check, Report

RowStatus = Literal["ok", "failed", "skipped"]


@dataclass
class FormatRow(Report):
    format: str
    status: RowStatus
    reason: str = ""  # why it failed or was skipped
    output: str | None = None
    route: list[str] = field(default_factory=list)
    size: int | None = None  # bytes on disk (a folder's files together)
    check: Check = "none"
    median_ms: dict[int, float] = field(default_factory=dict)  # programs: batch → median
    vs_eager: float | None = None  # geometric mean over batch sizes of eager / this
    vs_compile: float | None = None  # the same against torch.compile


@dataclass
class EveryFormatReport(Report):
    source: str
    source_format: str
    out_dir: str
    batch_sizes: list[int]
    rows: list[FormatRow]
    seconds: float
    baselines: dict[str, dict[int, float]] = field(default_factory=dict)  # eager, torch.compile
    bench: Any = None  # the verify.bench.BenchReport of every contender
    exit_code: int = 0  # 0, or the exit code of the first format that failed
    notes: list[str] = field(default_factory=list)  # where the source came from (a Hub id)


def convert_every(
    src: str | Path,
    out_dir: str | Path,
    opts: Options,
    *,
    batch_sizes: list[int] | None = None,
    repeats: int = 10,
    warmup: int = 2,
) -> EveryFormatReport:
    from ptconvert.convert.batch_manifest import MANIFEST, Manifest, output_key
    from ptconvert.convert.engine import convert
    from ptconvert.convert.optimize import speedup, time_beside_eager
    from ptconvert.convert.output_naming import output_for
    from ptconvert.convert.planning import plan_for
    from ptconvert.formats import FORMATS, FORMATS_BY_NAME, detect
    from ptconvert.verify.runtime import open_runtime

    started = time.perf_counter()
    src, out_dir = Path(src), Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError("--to all writes a folder of outputs: -o names a folder", path=out_dir)
    if opts.device != "cpu":
        raise UsageError("--to all times on the CPU only in this version")
    source_format = detect(src).format
    rows: list[FormatRow] = []
    failures: list[PtconvertError] = []
    # an interrupted run's finished formats are kept, as a folder of models' are (its manifest)
    manifest = Manifest(out_dir / MANIFEST)
    # not the layouts another target's option writes (hf, sharded): no route of their own
    targets = [f for f in FORMATS if f.name != source_format and not f.written_by]
    for k, fmt in enumerate(targets, 1):
        try:  # no route at all, or one written by another target's option: not for --to all
            plan_for(src, fmt.name, opts)
        except (UsageError, UnsupportedConversionError) as exc:
            rows.append(FormatRow(fmt.name, "skipped", _first_line(exc)))
            continue
        out = out_dir / output_for(src, fmt.name, opts).name
        key = output_key(src, fmt.name, out, opts)
        done = manifest.complete(fmt.name, key, out, fmt.name, opts.verify)
        if done is not None:
            kept = "kept from an earlier run, complete and verified (--force converts it again)"
            check = cast(Check, done)  # as the manifest recorded it
            rows.append(FormatRow(fmt.name, "ok", kept, str(out), [], disk_size(out), check))
            continue
        # an output an earlier run wrote (and nobody changed since) is replaced without --force
        ours = replace(opts, force=opts.force or manifest.wrote(fmt.name, out, fmt.name))
        try:
            with progress.step(f"{k}/{len(targets)}: {fmt.name}"):
                report = convert(src, fmt.name, out, ours)
        except MissingRequirementError as exc:  # a route exists, what it needs is not here
            rows.append(FormatRow(fmt.name, "skipped", _first_line(exc)))
            continue
        except PtconvertError as exc:
            failures.append(exc)
            rows.append(FormatRow(fmt.name, "failed", _first_line(exc)))
            continue
        manifest.record(fmt.name, key, out, fmt.name, report.check)
        route = list(getattr(report, "route", []) or [f"{source_format} → {fmt.name}"])
        rows.append(FormatRow(fmt.name, "ok", "", str(out), route, disk_size(out), report.check))
    reference = open_runtime(src, opts)
    written = {
        r.format: Path(r.output)
        for r in rows
        if r.output and r.check == "parity" and FORMATS_BY_NAME[r.format].kind == "program"
    }
    sizes = batch_sizes or ([1, 8] if opts.dynamic_batch else [])
    baselines: dict[str, dict[int, float]] = {}
    timed = None
    if written and reference.call is not None and reference.inputs is not None:
        sizes = sizes or [reference.inputs.batch]
        medians, timed = time_beside_eager(src, reference, written, sizes, opts, repeats, warmup)
        baselines = {k: v for k, v in medians.items() if k in ("eager", "torch.compile")}
        for row in rows:
            row.median_ms = medians.get(row.format, {})
            row.vs_eager = speedup(baselines.get("eager", {}), row.median_ms)
            row.vs_compile = speedup(baselines.get("torch.compile", {}), row.median_ms)
    return EveryFormatReport(
        str(src),
        source_format,
        str(out_dir),
        sizes,
        rows,
        round(time.perf_counter() - started, 3),
        baselines,
        timed,
        failures[0].exit_code if failures else 0,
    )


def _first_line(exc: PtconvertError) -> str:
    return exc.message.splitlines()[0] + (f" ({exc.hint})" if exc.hint else "")
