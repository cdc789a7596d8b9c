"""A written program checked against the eager model it came from.

In-process formats (pt2, TorchScript): the program in memory (it shares the model's weights, no
second copy of them) is compared with eager at several batch sizes and every dynamic dim at its
ends, while the written file is loaded and run once in a fresh interpreter, as a user loads it.
That interpreter starts while the route runs (importing torch is most of what it costs) and
shares the cores with the comparison once the file exists. Isolated formats (AOTI, ONNX) are
loaded by their own runtime and compared the same way.

What the check costs follows from the model's first call (``first_call``, timed): eager runs once
per size (its outputs kept in one ``EagerRuns`` for every comparison), twice on one input once
per conversion (the determinism check), at sizes beyond 1, 2, 3 only while cheap
(``batches_by_cost``); the probes of a dynamic range take the sizes the comparison ran as judged.
Only the inputs whose dim 0 is the dynamic batch change with the batch size (``_pin_unbatched``).

A program that runs at a size where it computes something else than eager is never written as it
is: outside the range that holds, a format that bounds its dims is exported again with that range
(``RangeTooWide``, which the engine handles); inside it, or in ONNX, it is refused.
"""

from __future__ import annotations

import copy
import time
from functools import partial
from pathlib import Path
from typing import Any

from ptconvert import progress
from ptconvert.convert.renamed_inputs import in_order, program_names
from ptconvert.convert.state import Bounds, RunState
from ptconvert.errors import PtconvertError, VerificationError
from ptconvert.formats import FORMATS_BY_NAME
from ptconvert.memory import FP64_BUDGET_BYTES
from ptconvert.options import DYNAMIC_SPEC, Options
from ptconvert.verify.fresh_load import FreshLoad
from ptconvert.verify.judging import batches_to_compare, judge_program, stateful_sides
from ptconvert.verify.model_state import STATEFUL_CALLS, fresh_each_call, watched_call
from ptconvert.verify.parity import VARIED_BATCHES, EagerRuns, ParityReport, compare


class ExportAgain(VerificationError):
    """A program export captured that the check refuses, which the same route exported again
    otherwise would not be (the engine runs it again after ``apply``); ``note`` says so in the
    report."""

    note: str

    def new(self, state: RunState) -> bool:
        """Whether exporting again changes anything (never in circles)."""
        raise NotImplementedError

    def apply(self, state: RunState) -> None:
        raise NotImplementedError


class RangeTooWide(ExportAgain):
    """The written program runs at sizes of a dynamic dim where its outputs differ from eager's,
    all outside the range that holds: exported again with ``bounds`` (that range), the file
    refuses them."""

    def __init__(self, message: str, bounds: Bounds, note: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.bounds, self.note = bounds, note

    def new(self, state: RunState) -> bool:
        return any(state.bounds.get(k) != v for k, v in self.bounds.items())

    def apply(self, state: RunState) -> None:
        state.bounds.update(self.bounds)


class AxesCostBatchOne(ExportAgain):
    """With ``--dynamic-batch``, the axes a transformers family varies (made dynamic by default,
    not asked for) gave the program a guard that refuses batch 1 (Swin: a window count times
    the batch must not be 1), which the batch alone leaves through: exported again with them
    at the example's sizes, as ``--static-sequence`` does."""

    def __init__(self, message: str, note: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.note = note

    def new(self, state: RunState) -> bool:
        return bool(state.family_axes) and not state.static_axes

    def apply(self, state: RunState) -> None:
        state.static_axes = True


class TracedAxesWrong(ExportAgain):
    """A trace (TorchScript's ONNX exporter) with a transformers family's axes made dynamic by
    default (not asked for) runs wrong or fails at their other sizes (ViT's position table
    takes its configured size only): traced again with them at the example's sizes, as the
    export route gives them up when torch.export fails on them."""

    def __init__(self, message: str, note: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.note = note

    def new(self, state: RunState) -> bool:
        return bool(state.family_axes) and not state.static_axes

    def apply(self, state: RunState) -> None:
        state.static_axes = True


# The check's optional work — batch sizes beyond 1, 2 and 3, probes of a dynamic dim above its
# example — is sized to a share of the time the route's steps took (export, save, …), so that
# checking a large model costs a fraction of converting it; the comparisons it always makes (the
# example, batch 1 and 3, each dim's smallest and a middle size, the written file in a fresh
# process) run whatever they cost, and batch 1, 2 and 3 count against the share before a larger
# batch size is added. A tiny model's calls take milliseconds: all of it runs.
CHECK_SHARE = 0.3
MIN_CHECK_SECONDS = 0.5


# the probes' optional sizes run within what the comparisons left of the check's seconds; a
# model whose call takes under FAST_CALL seconds gets PROBE_SECONDS at least (a slower one
# less, in proportion): its probes take milliseconds each and all of them run, whatever the
# machine's load, while a slow one's stop (Swin → ONNX's probes of a height 16 times the
# example's never finished; a 204 M decoder's took as long as its comparisons). A failing
# end's narrowing rounds get ``ranges.NARROWING_SECONDS`` at least, whatever the model.
PROBE_SECONDS = 20.0
FAST_CALL = 0.05


def check_seconds(steps_seconds: float) -> float:
    """The seconds the check's optional work may take after steps of ``steps_seconds``."""
    return max(MIN_CHECK_SECONDS, CHECK_SHARE * steps_seconds)


def optional_seconds(example_seconds: float | None, steps_seconds: float) -> float:
    """The seconds the check's optional work may take, the comparisons' included: the steps'
    share, or at least PROBE_SECONDS for a model whose call is fast, less as it slows (no step:
    a call timed while the fresh interpreter starts is not always the same side of a line)."""
    share = check_seconds(steps_seconds)
    if not example_seconds:
        return max(PROBE_SECONDS, share)
    return max(share, PROBE_SECONDS * min(1.0, FAST_CALL / example_seconds))


def batches_by_cost(
    example_seconds: float | None, example_batch: int, seconds: float
) -> tuple[list[int], list[int]]:
    """The default sizes compared (``judging.batches_to_compare``'s, by the estimated time of
    comparing them) and those left out."""
    cost = partial(_compare_cost, example_seconds, example_batch)
    kept, _ = batches_to_compare(None, True, example_batch, cost=cost, seconds=seconds)
    return kept, [b for b in VARIED_BATCHES if b not in kept]


def _compare_cost(example_seconds: float | None, example_batch: int, sizes: list[int]) -> float:
    """Eager and the program at each size, each call about linear in the batch."""
    per_item = (example_seconds or 0.0) / max(1, example_batch)
    return 2 * per_item * sum(sizes)


def probe_budget(example_seconds: float | None, seconds: float) -> int:
    """How many times the example's size a probe of a dynamic dim may reach: a probe runs the
    model about three times (eager, its fp64 copy, the program) at that size."""
    from ptconvert.verify.probes import DEFAULT_BUDGET

    if not example_seconds:
        return DEFAULT_BUDGET
    return max(1, min(DEFAULT_BUDGET, int(seconds / (3 * example_seconds))))


def traced(state: RunState) -> bool:
    """The program is a trace whose dims were declared (ONNX from TorchScript's exporter)."""
    return state.exported is None and state.declared is not None


def dims_source(state: RunState) -> Any:
    """What states the written program's dynamic dims: its ExportedProgram, or the dims it was
    declared with (``RunState.declared``: ONNX from TorchScript's exporter); None for neither."""
    return state.exported if state.exported is not None else state.declared


def dynamism(state: RunState) -> tuple[bool, bool]:
    """Whether the program has dynamic dims at all, and a dynamic batch (dim 0). TorchScript
    (no exported program, no declared dims) takes any size."""
    source = dims_source(state)
    if source is None:
        return True, True
    from ptconvert.verify.dims import dynamic_dims

    dims = dynamic_dims(source)
    return bool(dims), any(d.axis == 0 for d in dims)


def first_call(state: RunState) -> EagerRuns:
    """The model's first run, on the example inputs (``state.eager``, made once): timed, since
    the check's sizes are chosen by it; on a copy that shares the parameters, so that the state
    a call changes shows (``state.changes``); its outputs kept as eager's at the example's size
    when nothing changed. A model that raises says so here (``ModelRaisedError``), before any
    program is blamed."""
    from ptconvert.verify.parity import run_model

    assert state.inputs is not None
    if state.eager is not None and state.eager.made_by is state.inputs:
        return state.eager
    import torch

    sample = state.inputs.at(state.inputs.batch)
    runs = EagerRuns(made_by=state.inputs)
    with progress.step("running the model once on the example inputs"), torch.no_grad():
        try:
            started = time.perf_counter()
            changes, outputs = watched_call(state.reference, lambda m: m, sample, "the model")
            if changes is None:  # it cannot be copied: run as it is, its state not followed
                outputs = run_model(state.reference, copy.deepcopy(sample), "the model")
            state.example_seconds = time.perf_counter() - started
        except PtconvertError as exc:
            exc.path = exc.path or str(state.src)
            raise
    from ptconvert.model.wrappers import output_leaves

    state.changes = changes or []
    if not changes:
        runs.put(state.inputs.batch, sample, output_leaves(outputs))
    state.eager = runs
    return runs


def verify_program(state: RunState, to: str, artifact: Path, opts: Options) -> ParityReport | None:
    """Load the written program with its format's own runtime and compare it with the eager
    reference at several batch sizes (and every dynamic dim at its ends)."""
    target = FORMATS_BY_NAME.get(to)
    if target is None or target.kind != "program":
        return None
    if state.reference is None or state.inputs is None:
        state.notes.append("parity not checked: no eager reference or example inputs")
        return None
    _pin_unbatched(state, opts)
    if target.isolated:  # its runtime loads the written file in a process of its own
        first_call(state)
        with progress.step(f"loading the {to} file to compare it"):
            try:
                program = target.open(artifact, opts.device)
            except PtconvertError as exc:  # named by the user's output, not the staging copy
                exc.path = str(state.destination or artifact)
                raise
        try:
            return _compare_program(state, to, program, opts)
        finally:
            program.close()
    # In-process formats: the program in memory is compared at every size; the written file is
    # run in a fresh process beside that comparison, at the example's size, its outputs compared
    # with eager's there: what was written is what was compared.
    # started with the route for small models, else now (PREWARM_BYTES)
    fresh, state.fresh = state.fresh or FreshLoad(to), None
    try:
        # the model's first call too runs on the cores the interpreter leaves (it imports torch)
        with fresh.sharing_cores():
            runs = first_call(state)
            sample = runs.inputs.get(state.inputs.batch) or state.inputs.at(state.inputs.batch)
            # a program exported positionally is called so; the others by keyword (TorchScript
            # binds either way)
            fresh.load(artifact, run=sample, positional=state.positional)
            report = _compare_program(state, to, _in_memory(state, target, artifact), opts)
            with progress.step("running the written file in a fresh process"):
                outputs = fresh.finish(state.src)
        if outputs is not None:
            # a stateful model is compared from its saved state, as the file starts from it
            reference = state.reference
            eager_known: EagerRuns | None = runs
            if state.changes:
                reference, eager_known = fresh_each_call(reference, lambda m: m, 1), None
            written = compare(
                reference,
                lambda **_: outputs,
                lambda b: sample,
                [state.inputs.batch],
                determinism="done",
                eager=eager_known,
            )
            if written.status != "pass":
                raise VerificationError(
                    f"the written {to}, loaded in a fresh process, differs from eager at batch "
                    f"{state.inputs.batch}: {written.sizes[0].detail}",
                    path=state.src,
                )
        return report
    finally:
        fresh.stop()


def _pin_unbatched(state: RunState, opts: Options) -> None:
    """Inputs whose dim 0 is not the dynamic batch keep the example's shape at every size
    compared (a table of fixed rows, a size the model asserts): the batched ones are those whose
    dim 0 the program has dynamic, or for TorchScript those --dynamic NAME:0 names (all with
    --dynamic-batch or without any)."""
    from ptconvert.model.inputs import pinned

    assert state.inputs is not None
    sample = state.inputs.at(state.inputs.batch)
    tensors = [n for n, v in sample.items() if getattr(v, "dim", lambda: 0)() > 0]
    if (source := dims_source(state)) is not None:
        from ptconvert.verify.dims import dynamic_dims

        renamed = program_names(state) or {}
        batched = {renamed.get(d.input, d.input) for d in dynamic_dims(source) if d.axis == 0}
        if batched and not batched & set(sample):
            # a dynamic batch under names the model's inputs do not have: pinning every input
            # would compare at the example's size alone; they all move with the batch instead
            state.notes.append(
                f"the program's batched inputs ({', '.join(sorted(batched))}) are not named as "
                "the model's: every input is resized with the batch in the check"
            )
            return
    else:
        matches = (DYNAMIC_SPEC.match(spec) for spec in opts.dynamic)
        batched = {m["name"] for m in matches if m is not None and m["axis"] == "0"}
        if opts.dynamic_batch or not batched:
            return
    before = state.inputs
    state.inputs = pinned(before, [n for n in tensors if n not in batched])
    if state.eager is not None and state.eager.made_by is before:
        state.eager.made_by = state.inputs  # the example's inputs are the same


def _in_memory(state: RunState, target: Any, artifact: Path) -> Any:
    """The program just written, as its format's ``open`` would give it, from memory."""
    from ptconvert.formats.program import Program, by_position

    if state.exported is not None and state.scripted is None:
        from ptconvert.formats.pt2 import program_from_exported

        return program_from_exported(state.exported)
    if state.scripted is not None and state.exported is None:
        names = [a.name for a in state.scripted.forward.schema.arguments[1:]]
        return Program(
            by_position(state.scripted, names),
            None,
            state.scripted,
            lambda m: by_position(m, names),
        )
    return target.open(artifact)  # neither, or both (TS2EP): the file itself


def _compare_program(state: RunState, to: str, program: Any, opts: Options) -> ParityReport:
    assert state.inputs is not None
    if program_names(state) and state.positional is not None:  # TS2EP's x_1: by position
        program = in_order(program, state.positional)
    candidate: Any = program.call
    reference: Any = state.reference
    runs = first_call(state)
    # several sizes (and so several input draws): a frozen branch or shape shows at one of them
    exported = state.exported is not None
    any_dynamic, batch_dynamic = dynamism(state)
    example_batch, example_seconds = state.inputs.batch, state.example_seconds
    batches, said = batches_to_compare(
        opts.batch_sizes,
        batch_dynamic,
        example_batch,
        cost=lambda sizes: _compare_cost(example_seconds, example_batch, sizes),
        seconds=check_seconds(state.steps_seconds),
    )
    state.notes += said
    changed = state.changes
    if changed:
        reference, candidate, reset = stateful_sides(
            reference, lambda m: m, candidate, program.module, program.call_of
        )
        state.notes.append(
            f"stateful model: a call changes its {', '.join(changed)}; the program and the eager "
            f"model were each run {STATEFUL_CALLS} times in a row from their saved state and "
            "every call compared"
            if reset
            else f"stateful model: a call changes its {', '.join(changed)}; the {to} runtime "
            "runs in another process and cannot be reset: each size compared on its first call"
        )
        runs = EagerRuns(made_by=state.inputs)  # eager's outputs so far came from other calls
    ranged = program.exported or dims_source(state)
    inputs = state.inputs
    by_accuracy = _judged_by_accuracy(state, opts)
    example = max(inputs.batch, 2) if batch_dynamic else inputs.batch
    budget = probe_budget(state.example_seconds, check_seconds(state.steps_seconds))
    seconds: float | None = optional_seconds(state.example_seconds, state.steps_seconds)
    if traced(state):
        # nothing says what a trace computes above its example (no guards, no symbolic
        # shapes): every probe runs, each dim's top at twice the example at least
        budget, seconds = max(budget, 2), None
    with progress.step(f"comparing the {to} program with eager at batch sizes {batches}"):
        judged = judge_program(
            reference,
            candidate,
            inputs.at,
            batches,
            ranged if any_dynamic else None,
            lambda: inputs.at(example),
            eager=runs,
            budget=budget,
            seconds=seconds,
            shared=not opts.batch_sizes,  # sizes the user asks for spend none of it
            rename=program_names(state),
            accuracy=by_accuracy,
        )
    report = judged.parity
    if (skipped := report.skipped_note()) is not None:
        state.notes.append(skipped)
    if judged.ranges is not None and judged.ranges.dims:
        _judge_ranges(state, to, judged.ranges, opts)
    if opts.batch_sizes and judged.dropped:
        state.notes.append(
            f"--batch-sizes {judged.dropped} left out: outside the range the program runs for"
        )
    assert report is not None
    if not report.fp64_reference:
        from ptconvert.verify.parity import fp64_bytes

        size = fp64_bytes(state.reference)
        state.notes.append(
            "the reference is the eager model in its own precision, run twice (the determinism "
            "check): "
            + (
                f"an fp64 copy of it ({size / 2**30:.1f} GiB) is over the budget"
                if size > FP64_BUDGET_BYTES
                else "it cannot be copied to fp64"
            )
        )
    if report.status != "pass" and by_accuracy and report.failed[0].status == "fail_accuracy":
        from ptconvert.verify.accuracy import AccuracyMissed

        raise AccuracyMissed(
            f"the {opts.quantize} program is further from the float32 model than allowed at "
            f"batch {report.failed[0].batch}: {report.failed[0].detail}",
            path=state.src,
            hint="--min-cosine / --max-error set the thresholds",
        )
    if report.status != "pass":
        bad = report.failed[0]
        raise VerificationError(
            f"the converted program differs from eager at batch {bad.batch}: {bad.status} "
            f"({bad.detail})",
            path=state.src,
            hint=_hint_for(bad.status, to, opts, exported),
        )
    label = opts.quantize or opts.dtype
    if label and (state.float_reference is not None or by_accuracy):
        from ptconvert.verify.accuracy import measure

        with progress.step(f"comparing the {label} program with float32 eager"):
            state.accuracy = measure(
                state.float_reference if state.float_reference is not None else reference,
                candidate,
                inputs.at,
                [s.batch for s in report.sizes],
                label,
                min_cosine=opts.min_cosine,
                max_error=opts.max_error,
                path=state.src,
            )
    return report


def _where_of(axis: Any) -> str:
    name, dim = axis.dims[0]
    return f"{name}:{dim}"


def _judged_by_accuracy(state: RunState, opts: Options) -> tuple[float, float] | None:
    """(min cosine, max error) when the program was quantized after its export (onnxruntime):
    no eager model computes at its precision, so every comparison, the dynamic dims' probes
    included, judges it by its accuracy against float32 eager (the reference then) instead of
    by a tolerance; None otherwise (a program quantized with its module is compared with it)."""
    if not opts.quantize or state.float_reference is not None:
        return None
    from ptconvert.verify.accuracy import thresholds

    state.notes.append(
        f"the {opts.quantize} program judged by accuracy against float32 eager at every size "
        "compared and probed (no eager model computes at its precision)"
    )
    return thresholds(opts.quantize, opts.min_cosine, opts.max_error)


def _hint_for(status: str, to: str, opts: Options, exported: bool) -> str:
    if status == "eager_nondeterministic":
        return "the eager model gives different outputs on the same inputs: eval mode, no dropout"
    if FORMATS_BY_NAME[to].isolated:
        return f"the {to} runtime computes something else than eager: check the pt2 route first"
    if not exported and opts.method != "trace":  # TorchScript, scripted
        return "the graph tried the routes it has; --method trace or export (--to pt2) differ"
    return "a trace may have frozen a branch or a shape: try --method script, or export"


def _judge_ranges(state: RunState, to: str, ranges: Any, opts: Options) -> None:
    """What the dynamic dims' probes mean for a conversion: the range that holds, in words;
    no size right is a refusal; sizes where the program runs wrong are ``_runs_wrong``."""
    from ptconvert.convert.exporting import dims_hint

    state.dynamic_range = {r.dim.where: r.text for r in ranges.dims}
    one = next((r for r in ranges.dims if r.dim.axis == 0 and r.not_at_one), None)
    again = state.exported is not None and state.module is not None  # export captured it
    if one is not None and again and state.family_axes and not state.static_axes:
        axes = " and ".join(a.name for a in state.family_axes)
        raise AxesCostBatchOne(
            f"the written {to} refuses batch 1 ({one.not_at_one[:200]})",
            f"{axes} kept at the example's sizes: made dynamic too, the program refused batch "
            f"1 ({one.not_at_one[:120]}); --dynamic {_where_of(state.family_axes[0])} makes "
            "one dynamic all the same",
            path=state.src,
        )
    family = {k for a in state.family_axes for k in a.dims}
    frozen = [r for r in ranges.dims if r.dim.key in family and (r.wrong or r.status == "fails")]
    if frozen and traced(state) and not state.static_axes:
        axes = " and ".join(a.name for a in state.family_axes)
        said = "; ".join(r.text for r in frozen)[:200]
        raise TracedAxesWrong(
            f"the traced {to} fails or runs wrong at other sizes of {axes} ({said})",
            f"{axes} kept at the example's sizes: declared dynamic, the traced graph or the "
            f"model itself failed, or the graph ran wrong, at other sizes ({said}); "
            "--static-sequence says so up front",
            path=state.src,
        )
    if ranges.status == "fail":
        raise VerificationError(
            "no size of a dynamic dimension gives the eager result: " + "; ".join(ranges.texts),
            path=state.src,
            hint=dims_hint(opts, "that dimension"),
        )
    if any(r.wrong for r in ranges.dims):
        raise _runs_wrong(state, to, ranges.dims)
    if ranges.status == "narrowed":
        state.notes.append(
            "the program does not run on the whole range "
            + ("declared" if traced(state) else "torch reports")
            + "; it runs for: "
            + "; ".join(ranges.texts)
        )


def _runs_wrong(state: RunState, to: str, dims: list[Any]) -> VerificationError:
    """The program runs at sizes where its outputs differ from eager's (``DimRange.wrong``).
    All outside the range that holds, in a format that bounds its dims: ``RangeTooWide`` with
    that range; else a refusal (sizes inside the range, or ONNX, which has no minimum or
    maximum for a dim)."""
    bad = [r for r in dims if r.wrong]
    where = "; ".join(f"{r.dim.where} at {', '.join(map(str, r.wrong[:4]))}" for r in bad)
    message = (
        f"the written {to} runs {where} and returns other outputs than eager there ("
        + "; ".join(r.text for r in bad)
        + ")"
    )

    def outside(r: Any) -> bool:
        return r.low is not None and all(
            s < r.low or (r.high is not None and s > r.high) for s in r.wrong
        )

    if not all(outside(r) for r in bad):
        return VerificationError(
            message + ": sizes inside the range that holds elsewhere, which no bound leaves out",
            path=state.src,
            hint="make the model compute the same at every size (a branch on a size: both "
            "branches alike), or bound the dimension: --dynamic NAME:AXIS:MIN:MAX",
        )
    if not FORMATS_BY_NAME[to].bounds_dims:
        return VerificationError(
            message + f": {to} files cannot bound a dimension's size, so this one would take them",
            path=state.src,
            hint="convert to pt2 or aoti, whose files refuse sizes outside the range that holds, "
            "or make the model compute the same there",
        )
    bounds: Bounds = {r.dim.key: (r.low, r.high) for r in bad}
    note = "; ".join(
        f"{r.dim.where} bounded to {r.low}"
        + (f"–{r.high}" if r.high else " or more")
        + f" in the written {to}: at {', '.join(map(str, r.wrong[:4]))} the program ran and "
        "returned other outputs than eager, and the file now refuses those sizes"
        for r in bad
    )
    return RangeTooWide(message, bounds, note, path=state.src)


# Weights up to this size: the fresh interpreter that runs the written file starts with the
# route, before this process imports torch, and imports it meanwhile (seconds hidden); above,
# once the file is written (its torch, ~0.2 GB, beside the save's copy of the largest tensor was
# the conversion's peak memory) — unless the save writes the weights from where they lie
# (``Format.writes_weights_in_place``, a pt2): then its interpreter starts with the route
PREWARM_BYTES = 256 * 2**20


def started_early(opts: Options, to: str, weight_bytes: int | None) -> FreshLoad | None:
    """The check's fresh interpreter, started now when the route will be verified by one (an
    in-process program format) and its weights are small enough; else None."""
    target = FORMATS_BY_NAME.get(to)
    early = (
        opts.verify
        and target is not None
        and target.kind == "program"
        and not target.isolated
        and ((weight_bytes or 0) <= PREWARM_BYTES or target.writes_weights_in_place())
    )
    return FreshLoad(to) if early else None
