"""Running a conversion through the graph: plan, run step by step, fall back, write, verify.

When a step fails, the graph plans again without that edge from the stage reached so far and
tries the next route; the report says which route ran and why the first failed. The output is
written atomically and, for programs, reloaded from disk and compared with the eager reference
at several batch sizes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert import progress
from ptconvert.atomic import atomic_path, check_output
from ptconvert.convert.graph import EDGES, Edge, Plan, plan
from ptconvert.convert.state import Options, RunState, StepRecord
from ptconvert.convert.steps import STEPS, user_inputs
from ptconvert.errors import PtconvertError, UnsupportedConversionError, VerificationError
from ptconvert.formats import Detection, detect
from ptconvert.report import Report
from ptconvert.scan.guard import refuse_unsafe
from ptconvert.verify.parity import ParityReport, compare

SUFFIXES = {"pt2": ".pt2", "torchscript": ".ts.pt", "safetensors": ".safetensors", "pt": ".pt"}


@dataclass
class ConversionReport(Report):
    source: str
    source_format: str
    output: str
    target_format: str
    route: list[str]
    steps: list[StepRecord]
    seconds: float
    notes: list[str] = field(default_factory=list)
    dynamic_range: dict[str, str] = field(default_factory=dict)
    parity: ParityReport | None = None
    bench: Any = None  # a verify.bench.BenchReport when --bench was given


def available_needs(src_format: str, opts: Options) -> frozenset[str]:
    have = set()
    if opts.model or src_format == "hf":
        have.add("model_spec")
    if opts.inputs or opts.example_inputs or opts.model or src_format == "hf":
        have.add("example_inputs")  # a factory module may define example_inputs()
    if opts.trust:
        have.add("trust")
    return frozenset(have)


def inapplicable(d: Detection) -> frozenset[Edge]:
    """Edges that do not fit this file: a state dict is not a pickled module, and back."""
    if d.format != "pt":
        return frozenset()
    from ptconvert.formats import describe

    whole_module = bool(describe(d.path).needs_code)
    kind = "weights" if whole_module else "module"
    return frozenset(e for e in EDGES if e.src == "pt" and e.dst == kind)


def plan_for(src: str | Path, to: str, opts: Options) -> Plan:
    refuse_unsafe(src)
    d = detect(src)
    return plan(d.format, to, available_needs(d.format, opts), inapplicable(d))


def convert_program(
    src: str | Path, to: str, output: str | Path | None = None, opts: Options | None = None
) -> ConversionReport:
    """Convert ``src`` to ``to`` through the converter graph."""
    opts = opts or Options()
    started = time.perf_counter()
    src = Path(src)
    refuse_unsafe(src)
    d = detect(src)
    banned: set[Edge] = set(inapplicable(d))
    try:
        current = plan(d.format, to, available_needs(d.format, opts), frozenset(banned))
    except PtconvertError as exc:
        exc.path = exc.path or str(src)  # name the file in the message
        raise
    if not current.runnable:
        from ptconvert.errors import MissingRequirementError

        need, hint = next(iter(current.missing.items()))
        raise MissingRequirementError(
            f"{' → '.join([current.src, *[e.dst for e in current.edges]])} needs {need}",
            path=src,
            hint=hint,
        )
    out = Path(output) if output else src.with_name(src.name.split(".")[0] + SUFFIXES[to])
    check_output(out, [src], opts.force)
    state = RunState(src, d.format, inputs=user_inputs(opts))
    records: list[StepRecord] = []
    route: list[str] = []
    with atomic_path(out) as tmp:
        state.output = tmp
        node, queue = d.format, list(current.edges)
        while queue:
            edge = queue.pop(0)
            t0 = time.perf_counter()
            notes_before = len(state.notes)
            try:
                with progress.step(f"{edge.src} → {edge.dst} ({edge.step})"):
                    STEPS[edge.step](state, opts)
            except PtconvertError as exc:
                records.append(_record(edge, t0, "failed", state, notes_before, exc.message))
                banned.add(edge)
                replanned = _replan(node, to, d.format, opts, banned, exc)
                queue = list(replanned.edges)
                continue
            records.append(_record(edge, t0, "ok", state, notes_before))
            route.append(f"{edge.src} → {edge.dst}")
            node = edge.dst
        if to == "torchscript":
            state.scripted.save(str(tmp))
        parity = _verify(state, to, tmp, opts) if opts.verify else None
    return ConversionReport(
        str(src),
        f"{d.format}/{d.layout}",
        str(out),
        to,
        route,
        records,
        round(time.perf_counter() - started, 3),
        state.notes,
        state.dynamic_range,
        parity,
    )


def _record(
    edge: Edge, t0: float, status: str, state: RunState, notes_before: int, error: str | None = None
) -> StepRecord:
    return StepRecord(
        edge.step,
        f"{edge.src} → {edge.dst}",
        round(time.perf_counter() - t0, 3),
        status,
        state.notes[notes_before:],
        error,
    )


def _replan(
    node: str, to: str, src_format: str, opts: Options, banned: set[Edge], exc: PtconvertError
) -> Plan:
    try:
        alternative = plan(node, to, available_needs(src_format, opts), frozenset(banned))
    except UnsupportedConversionError:
        raise exc from None
    if not alternative.runnable:
        raise exc
    return alternative


def _verify(state: RunState, to: str, artifact: Path, opts: Options) -> ParityReport | None:
    """Reload the written program and compare it with the eager reference."""
    import torch

    if to not in ("pt2", "torchscript") or state.reference is None or state.inputs is None:
        if to in ("pt2", "torchscript"):
            state.notes.append("parity not checked: no eager reference or example inputs")
        return None
    _loads_in_fresh_process(artifact, to, state)
    # reload from disk: the check is on what was written, not on the object in memory
    load = (lambda p: torch.export.load(p).module()) if to == "pt2" else torch.jit.load
    program = load(str(artifact))
    names = state.positional

    def candidate(**kwargs: Any) -> Any:
        return program(*[kwargs[n] for n in names]) if names else program(**kwargs)

    # several sizes (and so several input draws): a frozen branch or shape shows at one of them
    varied = [1, 2, 3, 5, 7]
    batches = varied if opts.dynamic_batch or to == "torchscript" else [state.inputs.batch]
    report = compare(state.reference, candidate, state.inputs.at, batches)
    if report.status != "pass":
        bad = report.failed[0]
        raise VerificationError(
            f"the converted program differs from eager at batch {bad.batch}: {bad.status} "
            f"({bad.detail})",
            path=state.src,
            hint="a trace may have frozen a branch or a shape: try --method script, or export",
        )
    return report


def _loads_in_fresh_process(artifact: Path, to: str, state: RunState) -> None:
    """Load the artifact in a new interpreter with only torch imported: what a user does. A
    program whose output spec needs another package's pytree registrations fails here."""
    import subprocess
    import sys

    load = "torch.export.load(p)" if to == "pt2" else "torch.jit.load(p)"
    code = f"import sys, torch\np = sys.argv[1]\n{load}\n"
    with progress.step("loading the result in a fresh process"):
        proc = subprocess.run(
            [sys.executable, "-c", code, str(artifact)], capture_output=True, text=True
        )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise VerificationError(
            f"the written {to} does not load in a fresh Python process: {last[:300]}",
            path=state.src,
        )
