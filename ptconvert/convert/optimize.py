"""``--optimize``: the fastest verified artifact.

Converts the source to every runnable program target (pt2 run eagerly by torch, an AOTInductor
package, ONNX on onnxruntime), each verified as any conversion is; times the ones that pass on
the same inputs beside eager and ``torch.compile`` (the baseline, not an artifact: it compiles
again in every process); keeps the fastest verified artifact as the output and says for every
candidate why it was kept or dropped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ptconvert import progress
from ptconvert.atomic import check_output, place_together, temp_folder
from ptconvert.errors import MissingRequirementError, PtconvertError, UsageError
from ptconvert.options import Options
from ptconvert.report import Check, Report


def targets() -> list[str]:
    """The program formats an edge writes from the exported program (pt2, aoti, onnx)."""
    from ptconvert.convert.graph import edges
    from ptconvert.formats import FORMATS_BY_NAME

    found = [e.dst for e in edges() if e.src == "exported" and e.dst in FORMATS_BY_NAME]
    return [t for t in dict.fromkeys(found) if FORMATS_BY_NAME[t].kind == "program"]


Outcome = Literal["kept", "dropped", "failed", "baseline"]


@dataclass
class Candidate(Report):
    runtime: str  # a target format, or "eager" / "torch.compile"
    outcome: Outcome
    reason: str
    check: Check = "none"  # the check its conversion ran
    route: list[str] = field(default_factory=list)
    median_ms: dict[int, float] = field(default_factory=dict)  # batch → median latency
    vs_eager: float | None = None  # geometric mean over batch sizes of eager / this


@dataclass
class OptimizeReport(Report):
    source: str
    output: str | None
    kept: str | None
    device: str
    batch_sizes: list[int]
    candidates: list[Candidate]
    seconds: float
    bench: Any = None  # the verify.bench.BenchReport of every contender
    notes: list[str] = field(default_factory=list)  # what -o's naming rule did


def optimize(
    src: str | Path,
    output: str | Path | None,
    opts: Options,
    *,
    batch_sizes: list[int] | None = None,
    repeats: int = 20,
    warmup: int = 3,
) -> OptimizeReport:
    from ptconvert.convert.engine import convert_program
    from ptconvert.verify.runtime import open_runtime

    started = time.perf_counter()
    src = Path(src)
    if opts.device != "cpu":
        raise UsageError(
            "--optimize times on the CPU only in this version",
            hint="convert with --to aoti --device cuda and time it with `ptconvert bench`",
        )
    reference = open_runtime(src, opts)
    if reference.call is None or reference.inputs is None:
        raise MissingRequirementError(
            "--optimize times the artifacts against the eager model: it needs the model and "
            "example inputs",
            path=src,
            hint="pass --model pkg.module:factory and --input NAME:SHAPE:DTYPE",
        )
    inputs = reference.inputs
    sizes = batch_sizes or ([1, 8] if opts.dynamic_batch else [inputs.batch])
    if output is not None:  # said before minutes of work, not after: each name it may take
        for target in targets():
            check_output(_destination(src, output, target)[0], [src], opts.force)
    parent = _destination(src, output, targets()[0])[0].parent  # the same for every format
    # beside the output (the kept file renames into place), removed whatever happens
    stack = contextlib.ExitStack()
    staging = stack.enter_context(temp_folder(parent / "ptconvert-optimize", name=parent))
    candidates: list[Candidate] = []
    written: dict[str, Path] = {}
    try:
        for target in targets():
            # each in its own folder, under the name it will have: ONNX external data files
            # are referred to by name
            name = _destination(src, output, target)[0].name
            out = staging / target / name
            out.parent.mkdir()
            try:
                report = convert_program(src, target, out, dataclasses.replace(opts, verify=True))
            except PtconvertError as exc:
                candidates.append(Candidate(target, "failed", exc.message))
                continue
            if report.check != "parity":
                candidates.append(Candidate(target, "failed", "no parity check could run"))
                continue
            written[target] = out
            candidates.append(Candidate(target, "dropped", "", report.check, report.route))
        medians, timed = time_beside_eager(src, reference, written, sizes, opts, repeats, warmup)
        for name in ("eager", "torch.compile"):
            if name in medians or name in timed.skipped:
                why = timed.skipped.get(name, "the baseline: not an artifact")
                candidates.append(Candidate(name, "baseline", why, median_ms=medians.get(name, {})))
        eager = medians.get("eager", {})
        for c in candidates:
            c.median_ms = c.median_ms or medians.get(c.runtime, {})
            c.vs_eager = speedup(eager, c.median_ms)
            if c.runtime in written and c.runtime in timed.skipped:
                c.outcome, c.reason = "failed", f"could not be timed: {timed.skipped[c.runtime]}"
        timed_ok = [c for c in candidates if c.runtime in written and c.outcome == "dropped"]
        best = max(timed_ok, key=lambda c: c.vs_eager or 0.0, default=None)
        destination: Path | None = None
        notes: list[str] = []
        if best is not None:
            best.outcome, best.reason = "kept", "the fastest verified artifact"
            if best.vs_eager is not None and best.vs_eager < 1:
                best.reason += f" (eager is faster still: this runs at {best.vs_eager:.2f}×)"
            for c in timed_ok:
                if c is not best:
                    c.reason = f"verified, slower than {best.runtime}"
            destination, notes = _destination(src, output, best.runtime)
            check_output(destination, [src], opts.force)
            _move_into_place(best.runtime, written[best.runtime], destination, opts.force)
    finally:
        stack.close()
    return OptimizeReport(
        str(src),
        str(destination) if destination else None,
        best.runtime if best else None,
        "cpu",
        sizes,
        candidates,
        round(time.perf_counter() - started, 3),
        timed,
        notes,
    )


def _destination(src: Path, output: str | Path | None, fmt: str) -> tuple[Path, list[str]]:
    """Where the artifact of ``fmt`` goes if kept, by ``convert``'s rule for ``-o``
    (docs/outputs.md; api._output_name): none or a folder, the default name (in it); a
    name without ``fmt``'s suffix gets it, said in the note returned."""
    from ptconvert.convert.output_naming import default_output, names_folder, program_suffixed

    if output is None:
        return default_output(src, fmt), []
    if names_folder(output):
        return Path(output) / default_output(src, fmt).name, []
    return program_suffixed(Path(output), fmt, chosen=True)


def time_beside_eager(
    src: Path,
    reference: Any,
    written: dict[str, Path],
    sizes: list[int],
    opts: Options,
    repeats: int,
    warmup: int,
) -> tuple[dict[str, dict[int, float]], Any]:
    """Eager, ``torch.compile`` of it, and each written program on its own runtime, on the
    same inputs at ``sizes``: the medians (runtime → batch → ms) and the BenchReport."""
    from ptconvert.verify.bench import bench
    from ptconvert.verify.runtime import open_runtime

    contenders: dict[str, Any] = {"eager": reference.call}
    if reference.module is not None and hasattr(reference.module, "forward"):
        import torch

        contenders["torch.compile"] = torch.compile(reference.module)
    runtimes = {
        t: open_runtime(p, dataclasses.replace(opts, trust=True)) for t, p in written.items()
    }
    contenders.update({t: r.call for t, r in runtimes.items()})
    try:
        with progress.step(f"timing {', '.join(contenders)} at batch sizes {sizes}"):
            timed = bench(
                str(src),
                contenders,
                reference.inputs.at,
                sizes,
                repeats=repeats,
                warmup=warmup,
                device="cpu",
            )
    finally:
        for r in runtimes.values():
            close = getattr(r.call, "close", None)
            if close is not None:
                close()
    medians: dict[str, dict[int, float]] = {}
    for t in timed.timings:
        medians.setdefault(t.runtime, {})[t.batch] = round(t.median_ms, 4)
    return medians, timed


def speedup(eager: dict[int, float], mine: dict[int, float]) -> float | None:
    common = [b for b in mine if b in eager and mine[b] > 0]
    if not common:
        return None
    return round(math.exp(sum(math.log(eager[b] / mine[b]) for b in common) / len(common)), 3)


def _move_into_place(fmt: str, staged: Path, destination: Path, force: bool) -> None:
    """The kept artifact and its companion files (ONNX external data) beside the output, the
    main file last; a replaced output's companions the new one lacks are removed. They were
    written under the destination's name."""
    from ptconvert.formats import FORMATS_BY_NAME

    moves, obsolete = [], []
    for companion, target in zip(
        FORMATS_BY_NAME[fmt].companions(staged),
        FORMATS_BY_NAME[fmt].companions(destination),
        strict=True,
    ):
        check_output(target, [], force)
        if companion.exists():
            moves.append((companion, target))
        else:
            obsolete.append(target)
    place_together([*moves, (staged, destination)], obsolete, replace=force)
