"""Running a conversion through the graph: plan, run step by step, fall back, write, verify.

When a step fails, the graph plans again without that edge from the stage reached so far and
tries the next route; the report says which route ran and why the first failed. The output is
written atomically and, for programs, reloaded from disk and compared with the eager reference
at several batch sizes.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from ptconvert import progress
from ptconvert.atomic import atomic_path, check_output, ensure_space, make_folder, place_together
from ptconvert.convert.cache import cache_slot
from ptconvert.convert.conversion_report import ConversionReport
from ptconvert.convert.graph import Edge, Plan, plan
from ptconvert.convert.interface import interface
from ptconvert.convert.output_naming import (
    byte_copy,
    client_file,
    client_options,
    default_output,
    fill_client_folder,
    one_file_note,
    output_for,
    writes_client_folder,
    writes_directory,
)
from ptconvert.convert.planning import available_needs, check_memory, estimate_memory, inapplicable
from ptconvert.convert.precision import refuse_unheld_precision
from ptconvert.convert.program_check import ExportAgain, first_call, started_early, verify_program
from ptconvert.convert.same_format import copy_cannot_change, verified_copy
from ptconvert.convert.state import RunState, StepRecord
from ptconvert.convert.weights import check_written, refuse_shards, weights_route, weights_written
from ptconvert.errors import (
    FilesystemError,
    MissingInputError,
    ModelRaisedError,
    OutOfMemoryError,
    OutputExistsError,
    PtconvertError,
    UnsupportedConversionError,
    UsageError,
    VerificationError,
)
from ptconvert.formats import FORMATS_BY_NAME, Detection, detect
from ptconvert.memory import peak_rss_mib
from ptconvert.model.build import user_inputs
from ptconvert.options import Options
from ptconvert.report import Check, StepStatus
from ptconvert.scan.guard import guard, refuse_unsafe
from ptconvert.verify.accuracy import AccuracyMissed


def convert(
    src: str | Path | None,
    to: str,
    output: str | Path | None = None,
    opts: Options | None = None,
) -> ConversionReport:
    """The one conversion entry: every conversion is a route of the converter graph, checked by
    the target's kind (weights written from weights: byte copies checked bitwise; programs: run
    against the eager model). Every result says in ``check`` which check ran."""
    opts = (opts or Options()).validate()
    if src is None:  # code alone: --model's factory builds the model
        return convert_program(None, to, output, opts)
    refuse_unsafe(src)  # before detection: an unrecognised file may still be a payload
    if not byte_copy(detect(src).format, to) and (opts.max_shard_size or opts.metadata):
        raise UnsupportedConversionError(
            "--max-shard-size and --metadata apply to weights written from weights "
            f"(not {detect(src).format} → {to})",
            path=src,
        )
    return convert_program(src, to, output, opts)


def convert_program(
    src: str | Path | None,
    to: str,
    output: str | Path | None = None,
    opts: Options | None = None,
) -> ConversionReport:
    """Convert ``src`` to ``to`` through the converter graph; ``src`` None: the model
    ``--model``'s factory builds, from code alone."""
    opts = opts or Options()
    started = time.perf_counter()
    if src is None:
        return _convert_code(to, output, opts, started)
    src = Path(src)
    refuse_unsafe(src)
    d = detect(src)
    weights = byte_copy(d.format, to)  # weights written from weights: checked bitwise
    if d.format == to and src.is_file() and not weights:
        copy_cannot_change(src, to, opts)
        out = Path(output) if output else default_output(src, to)
        check_output(out, [src], opts.force)
        return verified_copy(src, d, out, started, opts.force, opts.load_timeout)
    if weights:
        refuse_shards(to, opts.max_shard_size, src)
        refuse_unheld_precision(to, opts)  # weights from weights: no quantizer on that route
    # a program its client loads from a folder (optimum's model.onnx beside config.json) is
    # written as that folder, unless -o names a file of its format
    name = "" if weights else client_file(d, to)
    client = name if writes_client_folder(name, output) else ""
    opts, said = client_options(opts, client)
    banned: set[Edge] = set(inapplicable(d, to))
    try:
        current = plan(d.format, to, available_needs(d.format, opts), frozenset(banned))
    except PtconvertError as exc:
        exc.path = exc.path or str(src)  # name the file in the message
        raise
    if to in FORMATS_BY_NAME:
        FORMATS_BY_NAME[to].refuse_source(src)  # what the target cannot hold, before any work
    estimate_memory(current, d, opts)
    check_memory(current, opts, src)
    _refuse_unrunnable(current, src)
    out = Path(output) if output else output_for(src, to, opts)
    _check_outputs(out, to, [src], opts, folder=bool(client))
    if weights:  # the scan refuses before anything is made (the read step keeps its verdicts)
        folder = writes_directory(d, to, opts.max_shard_size, output)
        scans = guard(src, trust=opts.trust, allow=opts.allow, remote_code=opts.trust_remote_code)
        return _run_route(src, d, to, out, opts, current, banned, started, folder, scans)
    _check_before_work(to, opts)
    _check_space(current, out)
    # a client's folder: the cache keeps its program (its key names it: model.onnx)
    with cache_slot(d, to, out / client if client else out, opts) as slot:
        if slot.hit is not None:
            report = slot.report(src, started)
            if client:  # the program came out of the cache into the folder: the rest beside it
                report.notes.append(fill_client_folder(d, out, client))
                report.output = str(out)
            return report
        report = _run_route(src, d, to, out, opts, current, banned, started, client=client)
        report.notes[:0] = said
        if name and not client:
            report.notes.append(one_file_note(to, name, FORMATS_BY_NAME[to].folder_client))
        return slot.store(report)


def _refuse_unrunnable(current: Plan, src: Path) -> None:
    if current.runnable:
        return
    from ptconvert.errors import MissingRequirementError, NeedsTrustError

    need, hint = next(iter(current.missing.items()))
    # a file that needs code to load is refused as the scanner's gate refuses it (exit 11)
    error = NeedsTrustError if need == "trust" else MissingRequirementError
    raise error(
        f"{' → '.join([current.src, *[e.dst for e in current.edges]])} needs {need}",
        path=src,
        hint=hint,
    )


def _check_outputs(
    out: Path, to: str, inputs: list[Path], opts: Options, folder: bool = False
) -> None:
    check_output(out, inputs, opts.force)
    target = FORMATS_BY_NAME.get(to)
    for companion in target.companions(out) if target and not folder else []:
        check_output(companion, inputs, opts.force)


def _convert_code(
    to: str, output: str | Path | None, opts: Options, started: float
) -> ConversionReport:
    """A model from code alone: ``--model``'s factory builds it (its own initialisation, or the
    weights it loads itself), and the route runs from there. Nothing is read, so nothing is
    scanned; nothing to key a cache entry on but code, so none is kept."""
    if not opts.model:
        raise UsageError(
            "say what to convert: a checkpoint, a folder, or a model from code alone with "
            "--model pkg.module:factory"
        )
    if output is None:
        raise UsageError("a model from code alone has no file to write beside: pass -o OUTPUT")
    if opts.max_shard_size:
        raise UnsupportedConversionError(
            "--max-shard-size applies to weights read from a file (not a model from code alone)"
        )
    src = Path(opts.model)  # names the source in messages and the report
    d = Detection(src, "code", "model factory")
    current = plan("code", to, available_needs("code", opts))
    _refuse_unrunnable(current, src)
    out = Path(output)
    _check_outputs(out, to, [], opts)
    _check_before_work(to, opts)
    return _run_route(src, d, to, out, opts, current, set(), started)


def _run_route(
    src: Path,
    d: Detection,
    to: str,
    out: Path,
    opts: Options,
    current: Plan,
    banned: set[Edge],
    started: float,
    folder: bool = False,
    scans: list[Any] | None = None,
    client: str = "",
) -> ConversionReport:
    """The route run step by step inside ``atomic_path`` (planned again when a step or the
    parity check fails), the output written and checked. A weights route has the source's
    ``scans`` already and writes a ``folder`` or a file; example inputs are a program's. A
    program named ``client`` is written in a folder, the source's kept files beside it
    (``output_naming.client_file``)."""
    state = RunState(src, d.format, destination=out, folder=folder, scans=scans)
    state.target = to
    target = FORMATS_BY_NAME.get(to)
    records: list[StepRecord] = []
    route: list[str] = []
    placed: list[Path] = []  # companion files put in place before the main file
    with (
        _taken_back(placed, opts.force),
        atomic_path(out, directory=folder or bool(client), replace=opts.force) as tmp,
        _staging(state),
    ):
        program = tmp / client if client else tmp
        if client:  # its companions (ONNX external data) go beside it, in the folder
            state.destination = program
        # the check's interpreter imports torch while this one does (the example inputs are
        # torch's first import here), then while the route runs
        state.fresh = started_early(opts, to, current.weight_bytes)
        state.inputs = None if scans is not None else user_inputs(opts)
        state.output = program
        node, queue = d.format, list(current.edges)
        taken: list[Edge] = []
        rejected: list[str] = []  # programs written but refused by the parity check
        # where each step's notes start: a route refused by the check takes its notes with it
        notes_at: dict[Edge, int] = {}
        while True:
            while queue:
                edge = queue.pop(0)
                t0 = time.perf_counter()
                notes_before = notes_at[edge] = len(state.notes)
                state.another_way = False  # only the capture that runs now may say it has one
                state.writing, state.leads_to = not queue, edge.dst
                try:
                    with progress.step(f"{edge.src} → {edge.dst} ({edge.label or edge.step})"):
                        assert edge.run is not None
                        edge.run(state, opts)
                    _ensure(edge, state)
                except (
                    UsageError,
                    MissingInputError,
                    ModelRaisedError,
                    FilesystemError,
                    OutOfMemoryError,
                ):
                    raise  # the options, the inputs, the model, the machine: no route helps
                except PtconvertError as exc:
                    if weights_route([e.step for e in current.edges]):
                        raise  # weights read and written as they are: no other route to try
                    records.append(_record(edge, t0, "failed", state, notes_before, exc.message))
                    if edge.captures and _runnable(state):
                        first_call(state)  # the model's own error, if it raises, is the news
                    banned.add(edge)
                    try:
                        replanned = _replan(node, to, d.format, opts, banned, exc)
                    except PtconvertError as last:
                        raise _each_route(last, records, rejected) from None
                    queue = list(replanned.edges)
                    continue
                records.append(_record(edge, t0, "ok", state, notes_before))
                route.append(f"{edge.src} → {edge.dst}")
                taken.append(edge)
                node = edge.dst
                if node == "module":
                    _check_inputs(state)
            try:
                written = state.staged or program
                parity = verify_program(state, to, written, opts) if opts.verify else None
                break
            except VerificationError as exc:
                # a program that runs but computes something else (a branch on a size frozen
                # by export or trace): try the routes that remain from the module
                capture = next((e for e in taken if e.captures), None)
                cut = route.index(f"{capture.src} → {capture.dst}") if capture else 0
                if capture is not None:  # the refused program's notes go with it
                    del state.notes[notes_at.get(capture, len(state.notes)) :]
                if _narrows(exc, capture, state):
                    # wrong only outside the range that holds (the same route again, with that
                    # range exported: the file refuses the sizes outside it), or batch 1
                    # refused for the family's axes (exported again without them)
                    assert isinstance(exc, ExportAgain)
                    exc.apply(state)
                    state.notes.append(exc.note)
                    _forget_program(state)
                    node, queue = "module", taken[cut:]
                    route, taken = route[:cut], taken[:cut]
                    continue
                exc = _plain(exc)
                if capture is None or state.module is None or isinstance(exc, AccuracyMissed):
                    raise exc from None
                rejected.append(f"{capture.step}: {exc.message}")
                if state.another_way:  # the capture's next way (script refused: trace)
                    state.another_way = False  # each way is refused once: no circles
                    state.refused.append(exc.message)
                    _forget_program(state)
                    node, queue = "module", taken[cut:]
                    route, taken = route[:cut], taken[:cut]
                    continue
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
                route, taken = route[:cut], taken[:cut]
                node, queue = "module", list(replanned.edges)
        check: Check = "parity" if parity is not None else "none"
        if state.checked:  # the target's step checked what it wrote itself
            check = cast(Check, state.checked)
        from ptconvert.weights.read import weight_sources

        target = FORMATS_BY_NAME.get(to)
        weights_target = target is not None and target.kind == "weights" and to in weight_sources()
        if (
            opts.verify
            and not state.checked
            and (target is None or (target.kind == "weights" and not weights_target))
        ):
            state.notes.append(f"no check ran: ptconvert cannot read {to} files back")
        bitwise = None
        if weights_target and opts.verify and state.weights is not None:
            if state.weights.origin is None:
                state.notes.append(
                    "no check ran: the weights come from a program built in memory, with no "
                    "file to read them from independently"
                )
            else:
                bitwise = check_written(state, opts)
                check = "bitwise"
        placed += _publish(state, program, opts.force)
        if client:
            state.notes.append(fill_client_folder(d, tmp, client))
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
        interface(state, to, opts, parity, folder=bool(client)),
        check,
        weights=weights_written(state, out, bitwise),
        accuracy=state.accuracy,
        quantized=state.quantized,
    )


def _runnable(state: RunState) -> bool:
    return state.reference is not None and state.inputs is not None


def _check_inputs(state: RunState) -> None:
    """An input the model needs and was not given is said before anything is captured. The
    model itself first runs in the check (``program_check.first_call``), or when a capture
    fails, to tell the model's own error (an index past its embedding table) from a failure of
    every route."""
    from ptconvert.model.inputs import check_provided, required_inputs

    if state.inputs is None or state.module is None:
        return
    sample = state.inputs.at(state.inputs.batch)
    check_provided(required_inputs(state.module), sample, state.src)
    _initialise_lazy(state, sample)


def _initialise_lazy(state: RunState, sample: dict[str, Any]) -> None:
    """A model with lazy modules (``nn.LazyLinear``) becomes a plain one at its first call (its
    weights made, or taken from the checkpoint): it is called once on the example before
    anything captures it, as a user's first call would."""
    import copy

    import torch
    from torch.nn.modules.lazy import LazyModuleMixin

    from ptconvert.verify.parity import run_model

    # a lazy module stays one (its hooks, its class) until its first call, loaded weights or not
    if not any(isinstance(m, LazyModuleMixin) for m in state.module.modules()):
        return
    with progress.step("initialising the lazy modules"), torch.no_grad():
        try:
            run_model(state.module, copy.deepcopy(sample), "the model")
        except PtconvertError as exc:
            exc.path = exc.path or str(state.src)
            raise
    state.notes.append("the model has lazy modules: it was called once before capture")


def _narrows(exc: VerificationError, capture: Edge | None, state: RunState) -> bool:
    """Whether the program is exported again (``ExportAgain``: with the range that holds, or
    without the family's axes): export captured it from the module, and that changes something
    (a second program wrong outside the same bounds is refused, never exported in circles)."""
    return (
        isinstance(exc, ExportAgain)
        and capture is not None
        and capture.step in ("export", "onnx_trace_export")
        and state.module is not None
        and exc.new(state)
    )


def _plain(exc: VerificationError) -> VerificationError:
    """A range that cannot be narrowed is a plain refusal."""
    if isinstance(exc, ExportAgain):
        return VerificationError(exc.message, path=exc.path, hint=exc.hint)
    return exc


def _forget_program(state: RunState) -> None:
    state.exported = state.scripted = state.positional = state.declared = None
    state.graph_names = None
    state.dynamic_range = {}
    if state.output is not None and state.output.is_file():
        state.output.write_bytes(b"")  # the rejected program's bytes: the next is written anew
    _unstage(state)


def _unstage(state: RunState) -> None:
    """Remove a staging folder a step made (a rejected program's, or at the end)."""
    if state.staged is not None:
        shutil.rmtree(state.staged.parent, ignore_errors=True)
    state.staged, state.companions, state.obsolete = None, [], []


def _each_route(
    last: PtconvertError, records: list[StepRecord], rejected: list[str]
) -> PtconvertError:
    """The last route's error, saying what each route that failed before it said (the direct
    route's error is the one a user can act on as often as the fallback's), a program the
    check refused among them (AOTI's that ran wrong, before the TorchScript fallback failed):
    then the error is the check's (exit 6), whatever stopped the routes after it."""
    refused = [f"{r} (refused by the check)" for r in rejected]
    failed = [*refused, *(f"{r.step}: {r.error}" for r in records if r.status == "failed")]
    if len(failed) < 2:
        return last
    message = "every route failed; " + "; ".join(failed)
    if rejected:  # a program was written and computed something else: that is the finding
        return VerificationError(message, path=last.path, hint=last.hint)
    try:
        return type(last)(message, path=last.path, hint=last.hint)
    except TypeError:  # a class of its own signature: its message alone
        return last


def _tried_all(exc: VerificationError, rejected: list[str], records: list[StepRecord]) -> Exception:
    failed = [f"{r.step}: {r.error}" for r in records if r.status == "failed"]
    return VerificationError(
        "no route gives a program that matches the eager model; tried: "
        + "; ".join([*rejected, *failed]),
        path=exc.path,
        hint=exc.hint,
    )


def _record(
    edge: Edge,
    t0: float,
    status: StepStatus,
    state: RunState,
    notes_before: int,
    error: str | None = None,
) -> StepRecord:
    seconds = time.perf_counter() - t0
    state.steps_seconds += seconds
    return StepRecord(
        edge.step,
        f"{edge.src} → {edge.dst}",
        round(seconds, 3),
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


def _check_space(route: Plan, out: Path) -> None:
    """A program holds the model's weights (and a little more): refused before the work when
    the output's filesystem has not room for them; a write that fails anyway is an error too
    (``atomic.guarded_file``)."""
    if route.weight_bytes is not None:
        make_folder(out.parent)
        ensure_space(out.parent, route.weight_bytes, out, estimate=True)


def _check_before_work(to: str, opts: Options) -> None:
    """What the target needs of this machine and can hold, said before anything runs."""
    refuse_unheld_precision(to, opts)
    if opts.device != "cpu":
        from ptconvert.verify.check import require_device

        require_device(opts.device)


@contextmanager
def _staging(state: RunState) -> Iterator[None]:
    """Remove a staging folder a step made, and stop an interpreter started for a check that
    did not happen, whatever happens."""
    try:
        yield
    finally:
        _unstage(state)
        if state.fresh is not None:
            state.fresh.stop()
            state.fresh = None


def _publish(state: RunState, tmp: Path, replace: bool) -> list[Path]:
    """A staged target: its companions go in place first (over existing ones only with
    ``replace``), the main file last (onto ``tmp``, which ``atomic_path`` renames onto the
    output). Returns where the companions went."""
    if state.staged is None:
        return []
    assert state.destination is not None
    moves = [(c, state.destination.parent / c.name) for c in state.companions]
    place_together(moves, state.obsolete, replace=replace)
    os.replace(state.staged, tmp)  # the run's own temporary file
    return [destination for _, destination in moves]


@contextmanager
def _taken_back(placed: list[Path], replace: bool) -> Iterator[None]:
    """Companions placed for a main file that could not be published (another process wrote
    the output meanwhile) are removed again: without ``replace`` they replaced nothing."""
    try:
        yield
    except OutputExistsError:
        for path in placed if not replace else ():
            path.unlink(missing_ok=True)
        raise


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
