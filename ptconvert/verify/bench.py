"""``ptconvert bench``: latency of eager, torch.compile and the converted artifact, side by side.

Same inputs for every contender; warm-up runs first (the first call is timed on its own: for
torch.compile it is the compile time), then repeats interleaved across contenders so frequency
scaling and load hit all alike; medians with p25/p75; speedups from the medians. Threads are set
once for all and recorded. CUDA runs are synchronised around each call.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ptconvert.report import Report

if TYPE_CHECKING:
    from ptconvert.options import BenchKeywords, Options


@dataclass
class Timing(Report):
    runtime: str
    batch: int
    first_call_s: float
    median_ms: float
    p25_ms: float
    p75_ms: float
    samples: int
    peak_memory_mib: float | None = None  # CUDA: this contender's peak during its warm-up


@dataclass
class BenchReport(Report):
    artifact: str
    threads: int
    device: str
    repeats: int
    timings: list[Timing] = field(default_factory=list)
    speedups: list[dict[str, Any]] = field(default_factory=list)  # per batch: artifact vs others
    peak_rss_mib: float = 0.0
    skipped: dict[str, str] = field(default_factory=dict)  # runtime → why it was not timed
    notes: list[str] = field(default_factory=list)  # timings too spread to be read as one number


# p25–p75 wider than ±NOISE of the median: the machine was busy, not the runtime slow
NOISE = 0.2


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
    return statistics.median(values), q[0], q[-1]


def bench(
    artifact: str,
    contenders: dict[str, Callable[..., Any]],
    make_inputs: Callable[[int], dict[str, Any]],
    batch_sizes: list[int],
    *,
    repeats: int = 30,
    warmup: int = 5,
    threads: int | None = None,
    device: str = "cpu",
    skipped: dict[str, str] | None = None,
) -> BenchReport:
    """Time every contender on the same inputs at every batch size."""
    import resource

    import torch

    if threads:
        torch.set_num_threads(threads)
    report = BenchReport(
        artifact, torch.get_num_threads(), device, repeats, skipped=dict(skipped or {})
    )
    for b in batch_sizes:
        inputs = make_inputs(b)
        first: dict[str, float] = {}
        peaks: dict[str, float] = {}
        live = dict(contenders)
        with torch.no_grad():
            for name, fn in list(live.items()):
                try:
                    if device == "cuda":
                        torch.cuda.reset_peak_memory_stats()
                    t = time.perf_counter()
                    fn(**inputs)
                    _sync(device)
                    first[name] = time.perf_counter() - t
                    for _ in range(warmup - 1):
                        fn(**inputs)
                    _sync(device)
                    if device == "cuda":
                        peaks[name] = torch.cuda.max_memory_allocated() / 2**20
                except Exception as exc:  # a contender that cannot run is reported, not fatal
                    report.skipped[name] = f"batch {b}: {type(exc).__name__}: {exc}"[:200]
                    del live[name]
            samples: dict[str, list[float]] = {name: [] for name in live}
            for _ in range(repeats):  # interleaved: every round runs every contender once
                for name, fn in live.items():
                    timed = getattr(fn, "timed", None)
                    if timed is not None:  # a runtime in another process times itself there
                        samples[name].append(timed(**inputs))
                        continue
                    t = time.perf_counter()
                    fn(**inputs)
                    _sync(device)
                    samples[name].append((time.perf_counter() - t) * 1000)
        for name, values in samples.items():
            med, p25, p75 = _quantiles(values)
            if med > 0 and (p75 - p25) / 2 > NOISE * med:
                report.notes.append(
                    f"{name} at batch {b}: p25–p75 {p25:.3g}–{p75:.3g} ms around {med:.3g} ms "
                    f"(±{(p75 - p25) / 2 / med:.0%}): noise, another load on the machine; "
                    "more --repeats or a quieter machine"
                )
            report.timings.append(
                Timing(name, b, round(first[name], 4), med, p25, p75, len(values), peaks.get(name))
            )
        report.speedups.append(_speedups(b, [t for t in report.timings if t.batch == b]))
    report.peak_rss_mib = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return report


def bench_artifact(artifact: str, opts: Options, keywords: BenchKeywords) -> BenchReport:
    """Eager (the reference's module, or the artifact's own), torch.compile of it, and the
    artifact's runtime, on the artifact's (or the reference's) example inputs, all on the
    keywords' ``device`` (bench's keywords: ``options.BenchKeywords``)."""
    reference = None if keywords.reference is None else str(keywords.reference)
    batch_sizes, compile_mode = keywords.batch_sizes, keywords.compile_mode
    repeats, warmup, threads = keywords.repeats, keywords.warmup, keywords.threads
    device = keywords.device or opts.device
    from ptconvert.errors import UsageError

    if repeats < 1 or warmup < 0:
        raise UsageError("bench needs --repeats 1 or more and --warmup 0 or more")
    if batch_sizes is not None and (not batch_sizes or min(batch_sizes) < 1):
        raise UsageError(f"batch sizes are 1 or more, got {batch_sizes}")
    import torch

    from ptconvert.errors import MissingRequirementError
    from ptconvert.formats import FORMATS_BY_NAME
    from ptconvert.scan.guard import refuse_unsafe
    from ptconvert.verify.runtime import open_runtime

    refuse_unsafe(artifact, reference)
    cand = open_runtime(artifact, opts)
    ref = open_runtime(reference, opts) if reference else cand
    if cand.call is None:
        raise MissingRequirementError(
            "a weights file has no runtime to time", path=artifact, hint="pass --model"
        )
    inputs = ref.inputs or cand.inputs
    if inputs is None:
        raise MissingRequirementError(
            "no example inputs to time with", path=artifact, hint="pass --input NAME:SHAPE:DTYPE"
        )
    contenders: dict[str, Callable[..., Any]] = {}
    skipped: dict[str, str] = {}
    if reference:
        eager = ref.call
    elif FORMATS_BY_NAME[cand.format].kind == "weights":
        eager = cand.module  # the artifact is itself an eager model (weights + a model spec)
    else:
        # a program timed alone: labelling it "eager" would compare it with itself
        eager = None
        skipped["eager"] = "no eager model to compare with: pass --reference SRC"
    from ptconvert.verify.check import on_device, require_device

    require_device(device)
    if device != "cpu" and eager is not None:
        eager = eager.to(device) if isinstance(eager, torch.nn.Module) else on_device(ref, device)
    if eager is not None:
        contenders["eager"] = eager
    if compile_mode == "none":
        skipped["torch.compile"] = "--compile-mode none"
    elif isinstance(eager, torch.nn.Module):
        mode = None if compile_mode == "default" else compile_mode
        contenders["torch.compile"] = torch.compile(eager, mode=mode)
    elif "torch.compile" not in skipped:
        skipped["torch.compile"] = "no eager nn.Module to compile (pass --reference SRC)"
    if device == "cpu":
        contenders["artifact"] = cand.call
    else:
        contenders["artifact"] = on_device(cand, device)
    sizes = batch_sizes or [inputs.batch]

    def make(b: int) -> dict[str, Any]:
        return {k: v.to(device) if hasattr(v, "to") else v for k, v in inputs.at(b).items()}

    return bench(
        artifact,
        contenders,
        make,
        sizes,
        repeats=repeats,
        warmup=warmup,
        threads=threads,
        device=device,
        skipped=skipped,
    )


def _speedups(batch: int, timings: list[Timing]) -> dict[str, Any]:
    """The artifact against eager and torch.compile at one batch size: the ratio of medians,
    and its spread (``_range``: the others' p25 over the artifact's p75 to their p75 over its
    p25). A range holding 1 is within the noise: no speedup to headline."""
    at = {t.runtime: t for t in timings}
    row: dict[str, Any] = {"batch": batch}
    mine = at.get("artifact")
    for other in ("eager", "torch.compile"):
        if mine is None or other not in at or not mine.median_ms:
            continue
        theirs = at[other]
        row[f"artifact_vs_{other}"] = round(theirs.median_ms / mine.median_ms, 3)
        if mine.p25_ms > 0 and mine.p75_ms > 0:
            low, high = theirs.p25_ms / mine.p75_ms, theirs.p75_ms / mine.p25_ms
            row[f"artifact_vs_{other}_range"] = [round(low, 3), round(high, 3)]
    return row


def plot(report: BenchReport, path: str) -> None:
    """Median latency (p25–p75 as error bars) per runtime and batch size, as a PNG."""
    from ptconvert.atomic import atomic_path
    from ptconvert.deps import require

    require("matplotlib")
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for runtime in dict.fromkeys(t.runtime for t in report.timings):
        rows = [t for t in report.timings if t.runtime == runtime]
        xs = [t.batch for t in rows]
        ys = [t.median_ms for t in rows]
        err = [[t.median_ms - t.p25_ms for t in rows], [t.p75_ms - t.median_ms for t in rows]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=runtime)
    ax.set_yscale("log")  # runtimes apart by orders of magnitude stay readable
    ax.set_xlabel("batch size")
    ax.set_ylabel("latency per call (ms, median, log scale)")
    ax.set_title(f"{report.artifact} ({report.threads} threads, {report.device})")
    ax.legend()
    fig.tight_layout()
    from pathlib import Path

    with atomic_path(Path(path), replace=True) as tmp:  # a plot is redrawn in place
        fig.savefig(tmp, format="png")
    plt.close(fig)
