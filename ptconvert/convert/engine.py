"""Running a conversion through the graph: plan, run step by step, fall back, write, verify.

When a step fails, the graph plans again without that edge from the stage reached so far and
tries the next route; the report says which route ran and why the first failed. The output is
written atomically and, for programs, reloaded from disk and compared with the eager reference
at several batch sizes.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ptconvert import progress
from ptconvert.atomic import atomic_path, check_output, place_together
from ptconvert.convert.cache import cache_slot
from ptconvert.convert.graph import EDGES, Edge, Plan, plan
from ptconvert.convert.state import RunState, StepRecord
from ptconvert.convert.steps import STEPS
from ptconvert.errors import (
    ModelRaisedError,
    PtconvertError,
    UnsupportedConversionError,
    UsageError,
    VerificationError,
)
from ptconvert.formats import FORMATS_BY_NAME, Detection, describe, detect
from ptconvert.memory import FP64_BUDGET_BYTES, peak_rss_mib
from ptconvert.model.build import user_inputs
from ptconvert.options import Options
from ptconvert.report import Check, Report, StepStatus
from ptconvert.scan.guard import refuse_unsafe
from ptconvert.verify.parity import (
    STATEFUL_CALLS,
    VARIED_BATCHES,
    ParityReport,
    compare,
    fresh_each_call,
    state_changes,
)

if TYPE_CHECKING:
    from ptconvert.convert.weights import WeightsReport


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
    # how to call the result: {"call": "prog(x, mask)", "inputs": [...], "keyword": bool,
    # "outputs": [...], "accepts": [...]} (programs only)
    interface: dict[str, Any] = field(default_factory=dict)
    # the check that ran: "parity" (run against eager), "bitwise" (weights read back),
    # "copy" (bytes compared), or "none" (--no-verify, or nothing to run it against)
    check: Check = "none"
    bench: Any = None  # a verify.bench.BenchReport when --bench was given
    cached: bool = False  # copied from the cache: the steps and check are those that filled it


def _suffix(fmt: str) -> str:
    known = FORMATS_BY_NAME.get(fmt)
    return known.suffix if known else f".{fmt}"


def default_output(src: Path, to: str) -> Path:
    return src.with_name(src.name.split(".")[0] + _suffix(to))


def byte_copy(src_format: str, to: str) -> bool:
    """Whether ``convert`` takes the weights path (byte copies checked bitwise), not the graph."""
    from ptconvert.convert.weights import WEIGHT_TARGETS
    from ptconvert.weights.read import weight_sources

    return to in WEIGHT_TARGETS and src_format in weight_sources()


def output_for(src: Path, to: str, opts: Options) -> Path:
    """Where ``convert`` writes ``src`` converted to ``to`` when no output is given."""
    from ptconvert.convert.weights import default_output as weights_output

    try:
        fmt = detect(src).format
    except PtconvertError:
        return default_output(src, to)  # the conversion will say what is wrong with it
    if byte_copy(fmt, to):
        return weights_output(src, to, fmt, opts.max_shard_size is not None)
    return default_output(src, to)


def available_needs(src_format: str, opts: Options) -> frozenset[str]:
    from ptconvert.convert.needs import available

    return available(src_format, opts)


def inapplicable(d: Detection) -> frozenset[Edge]:
    """Edges that do not fit this file: a state dict is not a pickled module, and back."""
    if not d.handler.may_hold_module:
        return frozenset()
    from ptconvert.formats import describe

    whole_module = bool(describe(d.path).needs_code)
    kind = "weights" if whole_module else "module"
    return frozenset(e for e in EDGES if e.src == d.format and e.dst == kind)


def plan_for(src: str | Path, to: str, opts: Options) -> Plan:
    """The route ``convert`` would take, after the same checks of the options it makes."""
    opts.validate()
    user_inputs(opts)  # a malformed --input is said here, as the conversion would say it
    refuse_unsafe(src)
    d = detect(src)
    if d.format == to and Path(src).is_file():
        _copy_cannot_change(Path(src), to, opts)
        copy = Edge(to, to, "copy", 0, label="a byte copy, compared with the source")
        return Plan(to, to, [copy], source=str(src))
    result = plan(d.format, to, available_needs(d.format, opts), inapplicable(d))
    result.source = str(src)
    _estimate_memory(result, d, opts)
    return result


def _estimate_memory(route: Plan, d: Detection, opts: Options) -> None:
    """A route that builds the model: its peak memory estimated from the size of the weights
    the conversion reads (the --key entry, not a training checkpoint's optimizer state), read
    symbolically, before anything is loaded."""
    from ptconvert.memory import available_bytes, program_estimate
    from ptconvert.weights.read import read_weights

    if not any(e.dst in ("module", "exported") for e in route.edges):
        return
    try:
        weights = read_weights(d.path, key=opts.key, skip_unsupported=True)
        weight_bytes = sum(e.nbytes for e in weights.stored)
    except PtconvertError:  # a whole pickled module, or a program: its size on disk
        weight_bytes = describe(d.path).size_bytes
    route.memory_estimate_bytes = program_estimate(weight_bytes, verify=opts.verify)
    route.memory_available_bytes = available_bytes()


def _check_memory(route: Plan, opts: Options, src: Path) -> None:
    need, free = route.memory_estimate_bytes, route.memory_available_bytes
    if need is None or free is None or need <= free or opts.force_memory:
        return
    from ptconvert.errors import MissingRequirementError

    raise MissingRequirementError(
        f"converting this model needs about {need / 2**30:.1f} GiB of memory and "
        f"{free / 2**30:.1f} GiB is available",
        path=src,
        hint="free memory or use a larger machine; --force-memory tries anyway",
    )


def convert(
    src: str | Path, to: str, output: str | Path | None = None, opts: Options | None = None
) -> ConversionReport | WeightsReport:
    """The one conversion entry: weights to weights by byte copies checked bitwise
    (``convert_weights``), anything else through the converter graph, checked by the target's
    kind. Every result says in ``check`` which check ran."""
    from ptconvert.convert.weights import convert_weights

    opts = (opts or Options()).validate()
    refuse_unsafe(src)  # before detection: an unrecognised file may still be a payload
    if byte_copy(detect(src).format, to):
        return convert_weights(
            src,
            to,
            output,
            force=opts.force,
            key=opts.key,
            keep_prefix=opts.keep_prefix,
            max_shard_size=opts.max_shard_size,
            metadata=opts.metadata,
            skip_unsupported=opts.skip_unsupported,
            verify=opts.verify,
            trust=opts.trust,
        )
    if opts.max_shard_size or opts.metadata:
        raise UnsupportedConversionError(
            "--max-shard-size and --metadata apply to weights written from weights "
            f"(not {detect(src).format} → {to})",
            path=src,
        )
    return convert_program(src, to, output, opts)


def convert_program(
    src: str | Path, to: str, output: str | Path | None = None, opts: Options | None = None
) -> ConversionReport:
    """Convert ``src`` to ``to`` through the converter graph (``convert`` picks this path)."""
    opts = opts or Options()
    started = time.perf_counter()
    src = Path(src)
    refuse_unsafe(src)
    d = detect(src)
    if d.format == to and src.is_file():
        _copy_cannot_change(src, to, opts)
        out = Path(output) if output else default_output(src, to)
        check_output(out, [src], opts.force)
        return _verified_copy(src, d, out, started)
    banned: set[Edge] = set(inapplicable(d))
    try:
        current = plan(d.format, to, available_needs(d.format, opts), frozenset(banned))
    except PtconvertError as exc:
        exc.path = exc.path or str(src)  # name the file in the message
        raise
    _estimate_memory(current, d, opts)
    _check_memory(current, opts, src)
    if not current.runnable:
        from ptconvert.errors import MissingRequirementError, NeedsTrustError

        need, hint = next(iter(current.missing.items()))
        # a file that needs code to load is refused as the scanner's gate refuses it (exit 11)
        error = NeedsTrustError if need == "trust" else MissingRequirementError
        raise error(
            f"{' → '.join([current.src, *[e.dst for e in current.edges]])} needs {need}",
            path=src,
            hint=hint,
        )
    out = Path(output) if output else default_output(src, to)
    check_output(out, [src], opts.force)
    target = FORMATS_BY_NAME.get(to)
    for companion in target.companions(out) if target else []:
        check_output(companion, [src], opts.force)
    _check_before_work(to, opts)
    with cache_slot(d, to, out, opts) as slot:
        if slot.hit is not None:
            return slot.report(src, started)
        return slot.store(_run_route(src, d, to, out, opts, current, banned, started))


def _run_route(
    src: Path,
    d: Detection,
    to: str,
    out: Path,
    opts: Options,
    current: Plan,
    banned: set[Edge],
    started: float,
) -> ConversionReport:
    """The route run step by step inside ``atomic_path`` (planned again when a step or the
    parity check fails), the output written and checked."""
    state = RunState(src, d.format, inputs=user_inputs(opts), destination=out)
    records: list[StepRecord] = []
    route: list[str] = []
    with atomic_path(out) as tmp, _staging(state):
        state.output = tmp
        node, queue = d.format, list(current.edges)
        taken: list[Edge] = []
        rejected: list[str] = []  # programs written but refused by the parity check
        while True:
            while queue:
                edge = queue.pop(0)
                t0 = time.perf_counter()
                notes_before = len(state.notes)
                state.writing = not queue
                try:
                    with progress.step(f"{edge.src} → {edge.dst} ({edge.label or edge.step})"):
                        STEPS[edge.step](state, opts)
                    _ensure(edge, state)
                except (UsageError, ModelRaisedError):
                    raise  # the user's options or the model itself: no other route helps
                except PtconvertError as exc:
                    records.append(_record(edge, t0, "failed", state, notes_before, exc.message))
                    banned.add(edge)
                    replanned = _replan(node, to, d.format, opts, banned, exc)
                    queue = list(replanned.edges)
                    continue
                records.append(_record(edge, t0, "ok", state, notes_before))
                route.append(f"{edge.src} → {edge.dst}")
                taken.append(edge)
                node = edge.dst
                if node == "module":
                    _check_eager(state)
            try:
                parity = _verify(state, to, state.staged or tmp, opts) if opts.verify else None
                break
            except VerificationError as exc:
                # a program that runs but computes something else (a branch on a size frozen
                # by export or trace): try the routes that remain from the module
                capture = next((e for e in taken if e.step in CAPTURING_STEPS), None)
                if capture is None or state.module is None:
                    raise
                rejected.append(f"{capture.step}: {exc.message}")
                banned.add(capture)
                try:
                    replanned = _replan("module", to, d.format, opts, banned, exc)
                except VerificationError:
                    raise _tried_all(exc, rejected, records) from None
                state.notes.append(
                    f"the program from {capture.step} failed the parity check ({exc.message}); "
                    f"tried {' → '.join(e.step for e in replanned.edges)} instead"
                )
                _forget_program(state)
                cut = route.index(f"{capture.src} → {capture.dst}")
                route, taken = route[:cut], taken[:cut]
                node, queue = "module", list(replanned.edges)
        check: Check = "parity" if parity is not None else "none"
        from ptconvert.weights.read import weight_sources

        target = FORMATS_BY_NAME.get(to)
        weights_target = target is not None and target.kind == "weights" and to in weight_sources()
        if opts.verify and (target is None or (target.kind == "weights" and not weights_target)):
            state.notes.append(f"no check ran: ptconvert cannot read {to} files back")
        if weights_target and opts.verify and state.weights is not None:
            from ptconvert.verify.weights import verify_weights

            if state.weights.origin is None:
                state.notes.append(
                    "no check ran: the weights come from a program built in memory, with no "
                    "file to read them from independently"
                )
            else:
                with progress.step("verifying every tensor bitwise"):
                    verify_weights(state.weights, tmp)
                check = "bitwise"
        _publish(state, tmp)
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
        _interface(state, to, opts, parity),
        check,
    )


def _interface(
    state: RunState, to: str, opts: Options, parity: ParityReport | None
) -> dict[str, Any]:
    """The calling convention of the written program, as a user calls it."""
    target = FORMATS_BY_NAME.get(to)
    if target is None or target.kind != "program" or state.inputs is None:
        return {}
    from ptconvert.model.wrappers import leaf_name

    sample = state.inputs.at(state.inputs.batch)
    names = state.positional or list(sample)
    # a program captured by torch.export binds by keyword or by position, as it was captured;
    # TorchScript binds either way
    exported = state.exported is not None
    keyword = state.positional is None and exported
    args = ", ".join(f"{n}=…" if keyword else n for n in names)
    if not exported:
        args += ", positionally or by keyword"
    sizes = parity.sizes if parity else []
    outputs = [leaf_name(o.name) for o in sizes[0].outputs] if sizes else []
    if outputs and all(o.startswith("call ") for o in outputs):  # a stateful model's calls
        outputs = [o.partition(".")[2] or "output" for o in outputs if o.startswith("call 1")]
    accepts: list[str] = []
    fixed = [n for n, v in sample.items() if not hasattr(v, "shape")]
    if fixed and exported:
        accepts.append(
            "the scalar inputs are fixed at their example values ("
            + ", ".join(f"{n}={sample[n]!r}" for n in fixed)
            + "): torch.export specialises Python numbers; TorchScript takes any"
        )
    if exported and not _dynamism(state)[0]:
        shapes = {n: list(v.shape) for n, v in sample.items() if hasattr(v, "shape")}
        accepts.append(
            "only the example's shapes "
            + ", ".join(f"{n}{s}" for n, s in shapes.items())
            + " (static: pass --dynamic-batch or --dynamic for other sizes)"
        )
    if exported:
        accepts += [f"{where}: {words}" for where, words in state.dynamic_range.items()]
    return {
        "load": target.load_line.replace("\n", "; "),
        "call": target.call_line(args),
        "inputs": names,
        "example": {n: list(v.shape) for n, v in sample.items() if hasattr(v, "shape")},
        "keyword": keyword,
        "outputs": outputs,
        "accepts": accepts,
    }


# A probe of a dynamic dim runs the model about four times (eager twice, fp64, the program) at up
# to ``budget`` × the example's size: the budget shrinks as the model's example call grows, so a
# large model is probed at 2-4× its example instead of 16×.
PROBE_SECONDS = 0.5


COMPARE_SECONDS = 3.0  # the default batch sizes beyond 1, 2, 3 only within this estimate


def batches_by_cost(
    example_seconds: float | None, example_batch: int
) -> tuple[list[int], list[int]]:
    """The default sizes compared (1, 2, 3 always; the larger primes while the estimated time
    of comparing them fits COMPARE_SECONDS) and those left out."""
    kept: list[int] = []
    left: list[int] = []
    for b in VARIED_BATCHES:
        fits = _compare_cost(example_seconds, example_batch, [*kept, b]) <= COMPARE_SECONDS
        (kept if b <= 3 or fits else left).append(b)
    return kept, left


def _compare_cost(example_seconds: float | None, example_batch: int, sizes: list[int]) -> float:
    """Eager and the program at each size, each call about linear in the batch."""
    per_item = (example_seconds or 0.0) / max(1, example_batch)
    return 2 * per_item * sum(sizes)


def probe_budget(example_seconds: float | None) -> int:
    from ptconvert.verify.ranges import DEFAULT_BUDGET

    if not example_seconds:
        return DEFAULT_BUDGET
    return max(2, min(DEFAULT_BUDGET, int(PROBE_SECONDS / example_seconds)))


def _dynamism(state: RunState) -> tuple[bool, bool]:
    """Whether the program has dynamic dims at all, and a dynamic batch (dim 0). TorchScript
    (no exported program) takes any size."""
    if state.exported is None:
        return True, True
    from ptconvert.verify.ranges import dynamic_dims

    dims = dynamic_dims(state.exported)
    return bool(dims), any(d.axis == 0 for d in dims)


def _check_eager(state: RunState) -> None:
    """Run the model once on the example inputs before capturing it: an input it needs and was
    not given, or an error of the model itself (an index past its embedding table), is said as
    such, not as a failure of every route."""
    import copy

    from ptconvert.model.inputs import check_provided, required_inputs
    from ptconvert.verify.parity import run_model

    if state.inputs is None or state.module is None:
        return
    sample = state.inputs.at(state.inputs.batch)
    check_provided(required_inputs(state.module), sample, state.src)
    import torch

    with progress.step("running the model once on the example inputs"), torch.no_grad():
        try:
            started = time.perf_counter()
            run_model(state.reference, copy.deepcopy(sample), "the model")
            state.example_seconds = time.perf_counter() - started
        except PtconvertError as exc:
            exc.path = exc.path or str(state.src)
            raise


# steps that turn a module into a program: the ones a failed parity check rules out
CAPTURING_STEPS = ("export", "script", "ts_to_exported")


def _forget_program(state: RunState) -> None:
    state.exported = state.scripted = state.positional = None
    state.dynamic_range = {}
    _unstage(state)


def _unstage(state: RunState) -> None:
    """Remove a staging folder a step made (a rejected program's, or at the end)."""
    if state.staged is not None:
        shutil.rmtree(state.staged.parent, ignore_errors=True)
    state.staged, state.companions, state.obsolete = None, [], []


def _tried_all(exc: VerificationError, rejected: list[str], records: list[StepRecord]) -> Exception:
    failed = [f"{r.step}: {r.error}" for r in records if r.status == "failed"]
    return VerificationError(
        "no route gives a program that matches the eager model; tried: "
        + "; ".join([*rejected, *failed]),
        path=exc.path,
        hint=exc.hint,
    )


def _copy_cannot_change(src: Path, to: str, opts: Options) -> None:
    """A file already in the format asked for is copied: options that ask for another program
    (dynamic dims, another capture method) cannot be met by a copy."""
    asked = [
        flag
        for flag, on in (
            ("--dynamic-batch", opts.dynamic_batch),
            ("--dynamic", bool(opts.dynamic)),
            ("--method", opts.method != "auto"),
        )
        if on
    ]
    if asked:
        raise UsageError(
            f"the file is already {to}: a copy cannot apply {', '.join(asked)}",
            path=src,
            hint="convert from the model's source (its weights with --model, or its Hugging "
            "Face directory) to get that program",
        )


def _verified_copy(src: Path, d: Detection, out: Path, started: float) -> ConversionReport:
    """The file already has the format asked for: a byte copy, checked against the source and,
    for programs, loaded in a fresh process as a user would."""
    import filecmp

    held = describe(src).files
    if len(held) > 1:  # ONNX external data: its file names are written inside the model
        raise UsageError(
            f"the file is already {d.format}, with its data in "
            f"{', '.join(Path(f['path']).name for f in held[1:])}: copy the files together",
            path=src,
        )
    with atomic_path(out) as tmp, progress.step(f"copying {d.format}"):
        shutil.copyfile(src, tmp)
        if not filecmp.cmp(src, tmp, shallow=False):
            raise VerificationError("the copy differs from the source", path=out)
        note = f"the source is already {d.format}: copied byte for byte and compared"
        # a copy's native code is not run: the source was never trusted
        if d.handler.kind == "program" and not d.handler.runs_native_code:
            fresh = _FreshLoad(tmp, d.format, torch_only=False)
            try:
                with progress.step("loading the copy in a fresh process"):
                    fresh.finish(RunState(src, d.format))
            finally:
                fresh.stop()
            note += "; the copy loads in a fresh Python process"
    step = StepRecord(
        "copy", f"{d.format} → {d.format}", round(time.perf_counter() - started, 3), "ok"
    )
    return ConversionReport(
        str(src),
        f"{d.format}/{d.layout}",
        str(out),
        d.format,
        [f"{d.format} → {d.format}"],
        [step],
        round(time.perf_counter() - started, 3),
        [note],
        check="copy",
    )


def _record(
    edge: Edge,
    t0: float,
    status: StepStatus,
    state: RunState,
    notes_before: int,
    error: str | None = None,
) -> StepRecord:
    return StepRecord(
        edge.step,
        f"{edge.src} → {edge.dst}",
        round(time.perf_counter() - t0, 3),
        status,
        state.notes[notes_before:],
        error,
        peak_rss_mib(),
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
    """Load the written program with its format's own runtime and compare it with the eager
    reference at several batch sizes (and every dynamic dim at its ends)."""
    target = FORMATS_BY_NAME.get(to)
    if target is None or target.kind != "program":
        return None
    if state.reference is None or state.inputs is None:
        state.notes.append("parity not checked: no eager reference or example inputs")
        return None
    if target.isolated:  # its runtime loads the written file in a process of its own
        with progress.step(f"loading the {to} file to compare it"):
            program = target.open(artifact, opts.device)
        try:
            return _compare_program(state, to, program, opts)
        finally:
            program.close()
    # In-process formats: the program in memory (sharing the model's weights, not a second
    # copy of them) is compared at every size; the written file is loaded in a fresh process
    # beside that comparison, as a user loads it, and run at the example's size, its outputs
    # compared with eager's there: what was written is what was compared.
    sample = state.inputs.at(state.inputs.batch)
    # a program exported positionally is called so; the others by keyword (TorchScript binds
    # either way)
    fresh = _FreshLoad(artifact, to, run=sample, positional=state.positional)
    try:
        report = _compare_program(state, to, _in_memory(state, target, artifact), opts)
        with progress.step("running the written file in a fresh process"):
            outputs = fresh.finish(state)
        if outputs is not None:
            # a stateful model is compared from its saved state, as the file starts from it
            reference = state.reference
            if state.stateful:
                reference = fresh_each_call(reference, lambda m: m, 1)
            written = compare(
                reference, lambda **_: outputs, lambda b: sample, [state.inputs.batch]
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
    candidate: Any = program.call
    reference: Any = state.reference
    # several sizes (and so several input draws): a frozen branch or shape shows at one of them
    exported = state.exported is not None
    any_dynamic, batch_dynamic = _dynamism(state)
    batches = [state.inputs.batch]
    if batch_dynamic:
        batches, left = batches_by_cost(state.example_seconds, state.inputs.batch)
        if left:
            state.notes.append(
                f"compared at batch sizes {batches}: {left} would take about "
                f"{_compare_cost(state.example_seconds, state.inputs.batch, left):.0f} s more "
                f"(sizes are chosen by the model's call time; `ptconvert verify --batch-sizes` "
                "checks any)"
            )
    changed = state_changes(reference, lambda m: m, state.inputs.at(batches[0]), "the model")
    state.stateful = bool(changed)
    if changed and program.module is not None and program.call_of is not None:
        # the model updates its own state on every call: both sides start from the saved state
        # and make the same calls in a row, every call's outputs compared
        reference = fresh_each_call(reference, lambda m: m, STATEFUL_CALLS)
        candidate = fresh_each_call(program.module, program.call_of, STATEFUL_CALLS)
        state.notes.append(
            f"stateful model: a call changes its {', '.join(changed)}; the program and the eager "
            f"model were each run {STATEFUL_CALLS} times in a row from their saved state and "
            "every call compared"
        )
    elif changed:
        reference = fresh_each_call(reference, lambda m: m, 1)
        state.notes.append(
            f"stateful model: a call changes its {', '.join(changed)}; the {to} runtime runs in "
            "another process and cannot be reset: each size compared on its first call"
        )
    ranged = program.exported or (state.exported if exported else None)
    if ranged is not None and any_dynamic:
        batches = _check_dynamic_dims(state, ranged, reference, candidate, opts, batches)
    with progress.step(f"comparing the {to} program with eager at batch sizes {batches}"):
        report = compare(reference, candidate, state.inputs.at, batches, determinism_once=True)
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
    if report.status != "pass":
        bad = report.failed[0]
        raise VerificationError(
            f"the converted program differs from eager at batch {bad.batch}: {bad.status} "
            f"({bad.detail})",
            path=state.src,
            hint=_hint_for(bad.status, to, opts, exported),
        )
    return report


def _hint_for(status: str, to: str, opts: Options, exported: bool) -> str:
    if status == "eager_nondeterministic":
        return "the eager model gives different outputs on the same inputs: eval mode, no dropout"
    if FORMATS_BY_NAME[to].isolated:
        return f"the {to} runtime computes something else than eager: check the pt2 route first"
    if not exported and opts.method != "trace":  # TorchScript, scripted
        return "the graph tried the routes it has; --method trace or export (--to pt2) differ"
    return "a trace may have frozen a branch or a shape: try --method script, or export"


def _check_dynamic_dims(
    state: RunState, ep: Any, reference: Any, candidate: Any, opts: Options, batches: list[int]
) -> list[int]:
    """Run every dynamic dim at its ends and between (``verify.ranges``); record the range that
    holds, in words. Returns the batch sizes of ``batches`` inside the batch dim's range."""
    from functools import partial

    from ptconvert.verify.ranges import batch_sizes_that_hold, check_program

    assert state.inputs is not None
    example = state.inputs.at(
        max(state.inputs.batch, 2) if _dynamism(state)[1] else state.inputs.batch
    )
    budget = probe_budget(state.example_seconds)
    with progress.step("checking every dynamic dimension at its ends"):
        judge = partial(compare, reference, candidate, determinism_once=True)
        ranges = check_program(ep, example, judge, budget=budget)
    if not ranges.dims:
        return batches
    state.dynamic_range = {r.dim.where: r.text for r in ranges.dims}
    if ranges.status == "fail":
        raise VerificationError(
            "no size of a dynamic dimension gives the eager result: " + "; ".join(ranges.texts),
            path=state.src,
            hint="drop --dynamic for that dimension, or bound it: --dynamic NAME:AXIS:MIN:MAX",
        )
    if ranges.status == "narrowed":
        state.notes.append(
            "the program does not run on the whole range torch reports; it runs for: "
            + "; ".join(ranges.texts)
        )
    return batch_sizes_that_hold(ranges, batches)


class _FreshLoad:
    """The artifact loading in a new interpreter with only its runtime imported: what a user
    does. It runs beside the comparison (it is mostly starting Python and importing torch);
    ``finish`` collects its verdict and, when it was given inputs (``run``), the outputs it
    computed on them. A program whose output spec needs another package's pytree registrations
    fails there (a copy of such a program is loaded as ptconvert loads it)."""

    def __init__(
        self,
        artifact: Path,
        to: str,
        *,
        torch_only: bool = True,
        run: dict[str, Any] | None = None,
        positional: list[str] | None = None,
    ) -> None:
        import subprocess
        import sys

        import torch

        load = FORMATS_BY_NAME[to].load_line
        if not torch_only:
            load = (
                "from pathlib import Path\nfrom ptconvert.formats import FORMATS_BY_NAME\n"
                f"FORMATS_BY_NAME[{to!r}].open(Path(p)).close()"
            )
        self.to = to
        self._runs = run is not None
        self._dir = Path(tempfile.mkdtemp(prefix="ptconvert-fresh-"))
        self._log: Any = None
        self._proc: Any = None
        try:
            code = f"import sys, torch\np = sys.argv[1]\n{load}\n"
            if run is not None:
                # tensors and Python scalars alike, read back with weights_only=True
                torch.save(dict(run), self._dir / "in")
                call = (
                    f"prog(*[feeds[n] for n in {positional!r}])"
                    if positional is not None
                    else "prog(**feeds)"
                )
                code += _RUN_ONCE.format(dir=str(self._dir), call=call)
            # its messages go to a file: a pipe nobody reads while the comparison runs fills
            self._log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed by finish/stop)
            self._proc = subprocess.Popen(
                [sys.executable, "-c", code, str(artifact)],
                stdout=subprocess.DEVNULL,
                stderr=self._log,
            )
        except BaseException:
            self.stop()
            raise

    def finish(self, state: RunState) -> tuple[Any, ...] | None:
        import torch

        self._proc.wait()
        self._log.seek(0)
        stderr = self._log.read()
        if self._proc.returncode != 0:
            last = (stderr.strip().splitlines() or ["?"])[-1]
            raise VerificationError(
                f"the written {self.to} does not load in a fresh Python process: {last[:300]}",
                path=state.src,
            )
        if not self._runs:
            return None
        return tuple(torch.load(self._dir / "out", weights_only=True))

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self._log is not None:
            self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)


# what the fresh process runs after loading: the example's inputs in, every output tensor out
_RUN_ONCE = """
from torch.utils._pytree import tree_leaves
feeds = torch.load("{dir}/in", weights_only=True)
with torch.no_grad():
    out = {call}
if hasattr(out, "to_tuple"):
    out = out.to_tuple()
torch.save([t for t in tree_leaves(out) if isinstance(t, torch.Tensor)], "{dir}/out")
"""


def _check_before_work(to: str, opts: Options) -> None:
    """What the target needs of this machine, said before anything runs."""
    if opts.device != "cpu":
        from ptconvert.verify.check import require_device

        require_device(opts.device)


@contextmanager
def _staging(state: RunState) -> Iterator[None]:
    """Remove a staging folder a step made, whatever happens."""
    try:
        yield
    finally:
        _unstage(state)


def _publish(state: RunState, tmp: Path) -> None:
    """A staged target: its companions go in place first, the main file last (onto ``tmp``,
    which ``atomic_path`` renames onto the output)."""
    if state.staged is None:
        return
    assert state.destination is not None
    moves = [(c, state.destination.parent / c.name) for c in state.companions]
    place_together([*moves, (state.staged, tmp)], state.obsolete)


_STAGES_HELD = ("weights", "module", "exported")  # RunState fields of the same names


def _ensure(edge: Edge, state: RunState) -> None:
    """What an edge promises: the stage it leads to is in memory; a file it writes exists."""
    held = edge.dst if edge.dst in _STAGES_HELD else None
    if held is not None and getattr(state, held) is None:
        raise UnsupportedConversionError(
            f"the {edge.step} step did not produce the {edge.dst} stage", path=state.src
        )
    written = state.staged or state.output
    if (
        held is None
        and state.writing
        and (written is None or not written.exists() or written.stat().st_size == 0)
    ):
        raise UnsupportedConversionError(
            f"the {edge.step} step wrote no {edge.dst} file", path=state.src
        )
