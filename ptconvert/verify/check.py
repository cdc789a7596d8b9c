"""``ptconvert verify REFERENCE CANDIDATE``: evidence that two artifacts compute the same.

Weights against weights are compared bitwise. Otherwise both get a runtime, the same seeded
inputs go through both at several batch sizes, and ``parity.compare`` judges every output (with
the reference's fp64 run as ground truth when it is an eager module). The report records the
environment the numbers were measured in.

Inputs are bound to the candidate's signature: both sides get exactly the example inputs the
candidate accepts (a BERT exported with ``input_ids`` alone is compared with the reference run on
``input_ids`` alone, not with a padded attention mask it never saw), renamed by ``--input-map``
(or automatically when each side takes one input). A model that changes its own state on every
call is compared from the same initial state on both sides.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert import _compat
from ptconvert.errors import (
    MissingRequirementError,
    ModelRaisedError,
    UsageError,
    VerificationError,
)
from ptconvert.model.inputs import pinned
from ptconvert.options import Options
from ptconvert.report import Report
from ptconvert.scan.guard import refuse_unsafe
from ptconvert.verify.judging import batches_to_compare, judge_program, stateful_sides
from ptconvert.verify.model_state import STATEFUL_CALLS, state_changes
from ptconvert.verify.parity import ParityReport
from ptconvert.verify.runtime import Runtime, Signature, open_runtime
from ptconvert.verify.weights import WeightsCheck


@dataclass
class StateCheck(Report):
    """State a model changes on a call (buffers, tensor/number attributes), and how the
    comparison dealt with it."""

    reference: list[str] | None = None  # None: not checked (the module cannot be copied)
    candidate: list[str] | None = None  # None: not checked (no module: another process)
    compared: str = ""  # how the two were compared

    @property
    def stateful(self) -> bool:
        return bool(self.reference or self.candidate)


@dataclass
class VerifyReport(Report):
    reference: str
    candidate: str
    kind: str  # "weights" | "program"
    status: str
    batches: list[int] = field(default_factory=list)
    parity: ParityReport | None = None
    weights: WeightsCheck | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    inputs_fed: list[str] = field(default_factory=list)  # by the reference's names
    inputs_left_out: list[str] = field(default_factory=list)  # the candidate does not take them
    input_map: dict[str, str] = field(default_factory=dict)  # reference name → candidate name
    state: StateCheck | None = None
    notes: list[str] = field(default_factory=list)
    # a pt2's dynamic dims: the range that holds, in words (each checked at its ends)
    ranges: dict[str, str] = field(default_factory=dict)


@dataclass
class InputBinding:
    """Which example inputs go to both sides, under which names."""

    fed: list[tuple[str, str, str]]  # (example name, reference name, candidate name)
    left_out: list[str]  # example inputs the candidate does not take
    notes: list[str] = field(default_factory=list)

    @property
    def renamed(self) -> dict[str, str]:
        return {r: c for _, r, c in self.fed if r != c}

    def make(self, at: Callable[[int], dict[str, Any]]) -> Callable[[int], dict[str, Any]]:
        """The reference's inputs at a batch size: the fed ones, by the reference's names."""

        def make(batch: int) -> dict[str, Any]:
            values = at(batch)
            return {r: values[e] for e, r, _ in self.fed}

        return make

    def for_candidate(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """``call`` taking the reference's names (renamed to the candidate's)."""
        renamed = self.renamed
        if not renamed:
            return call

        def candidate(**kwargs: Any) -> Any:
            return call(**{renamed.get(k, k): v for k, v in kwargs.items()})

        return candidate


def environment() -> dict[str, Any]:
    import sys

    import torch

    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cpu_count": os.cpu_count(),
    }
    if "onnxruntime" in sys.modules:
        env["onnxruntime"] = sys.modules["onnxruntime"].__version__
    return env


def _describe(who: str, runtime: Runtime) -> str:
    sig = runtime.signature
    takes = "any inputs (its signature is not known)" if sig is None else str(sig)
    where = f"{runtime.format}" + (f", {sig.source}" if sig is not None and sig.source else "")
    return f"{who} ({where}) takes {takes}"


def _problems(binding: InputBinding, ref: Signature | None, cand: Signature | None) -> list[str]:
    """What keeps ``binding`` from calling both sides: inputs one needs and does not get, or
    gets and does not take."""
    problems: list[str] = []
    to_cand = {c for _, _, c in binding.fed}
    to_ref = {r for _, r, _ in binding.fed}
    if cand is not None:
        problems += [f"the candidate needs {n!r}" for n in cand.required if n not in to_cand]
    if ref is not None:
        problems += [f"the reference takes no {r!r}" for r in sorted(to_ref) if not ref.accepts(r)]
        problems += [f"the reference needs {n!r}" for n in ref.required if n not in to_ref]
    return problems


def _select(
    triples: list[tuple[str, str, str]], cand: Signature | None, notes: list[str] | None = None
) -> InputBinding:
    fed = [t for t in triples if cand is None or cand.accepts(t[2])]
    left = [e for e, _, c in triples if not (cand is None or cand.accepts(c))]
    return InputBinding(fed, left, list(notes or []))


def _only_input(sig: Signature | None) -> str | None:
    """The one input a signature takes, if it takes exactly one."""
    if sig is None or sig.any_name:
        return None
    if len(sig.required) == 1:
        return sig.required[0]
    return sig.names[0] if len(sig.names) == 1 else None


def _automatic(
    example: list[str], ref: Signature | None, cand: Signature | None
) -> InputBinding | None:
    """A binding when the names differ in a way that leaves no doubt: TorchScript's debug names
    (``x`` → ``x_1`` in a converted program), or one input on each side."""
    if cand is not None and not cand.any_name:
        suffixed: dict[str, str] = {}
        for c in cand.names:
            if c in example:
                continue
            bases = [e for e in example if re.fullmatch(re.escape(e) + r"_\d+", c)]
            if len(bases) == 1 and bases[0] not in cand.names:
                suffixed[bases[0]] = c
        if suffixed:
            triples = [(e, e, suffixed.get(e, e)) for e in example]
            binding = _select(triples, cand)
            if not _problems(binding, ref, cand):
                binding.notes.append(
                    "inputs matched by name without the program's numeric suffix: "
                    + ", ".join(f"{e} → {c}" for e, c in suffixed.items())
                )
                return binding
    only_r, only_c = _only_input(ref), _only_input(cand)
    if only_r is None or only_c is None:
        return None
    r, c = only_r, only_c
    source = example[0] if len(example) == 1 else r if r in example else c if c in example else None
    if source is None:
        return None
    binding = InputBinding([(source, r, c)], [e for e in example if e != source])
    if _problems(binding, ref, cand):
        return None
    binding.notes.append(
        f"each side takes one input: the reference's {r!r} is fed to the candidate as {c!r} "
        f"(automatically; --input-map {r}={c} says so explicitly)"
    )
    return binding


def bind_inputs(
    example: list[str],
    ref: Runtime,
    cand: Runtime,
    input_map: dict[str, str] | None = None,
    values: dict[str, Any] | None = None,
) -> InputBinding:
    """The example inputs to feed: exactly those the candidate accepts, to both sides (under
    each side's name). UsageError, naming both signatures, when the two cannot be bound; its
    hint pairs the inputs by kind (``input_pairs``: ``values``, the example inputs, say theirs)."""
    input_map = dict(input_map or {})
    rs, cs = ref.signature, cand.signature
    for r, c in input_map.items():
        if cs is not None and not cs.accepts(c):
            raise UsageError(
                f"--input-map {r}={c}: the candidate takes no input {c!r}; "
                + _describe("the candidate", cand)
            )
        if rs is not None and not rs.accepts(r):
            raise UsageError(
                f"--input-map {r}={c}: the reference takes no input {r!r}; "
                + _describe("the reference", ref)
            )
        if r not in example and c not in example:
            raise UsageError(
                f"--input-map {r}={c}: no example input is named {r!r} or {c!r} "
                f"(they are {example})"
            )
    inverse = {c: r for r, c in input_map.items()}
    triples = []
    for e in example:
        # example inputs may be named by either side (a .pt2's own samples are the candidate's)
        if e in input_map:
            triples.append((e, e, input_map[e]))
        elif e in inverse:
            triples.append((e, inverse[e], e))
        else:
            triples.append((e, e, e))
    notes = [f"--input-map: {r} → {c}" for r, c in input_map.items()]
    binding = _select(triples, cs, notes)
    problems = _problems(binding, rs, cs)
    if problems and not input_map:
        auto = _automatic(example, rs, cs)
        if auto is not None:
            return auto
    if problems:
        a = (rs.required or rs.names) if rs is not None else []
        b = (cs.required or cs.names) if cs is not None else []
        from ptconvert.verify.input_pairs import kinds_of, suggested_pairs

        pairs = suggested_pairs(a, b, *kinds_of(ref, cand, values or {})) or ["REF=CAND"]
        raise UsageError(
            "the reference and the candidate take different inputs: "
            + _describe("the reference", ref)
            + "; "
            + _describe("the candidate", cand)
            + f"; the example inputs are {example} ("
            + "; ".join(problems)
            + ")",
            path=cand.path,
            hint=f"map reference inputs to the candidate's with --input-map {' '.join(pairs)} "
            "(--input-map REF=CAND, repeatable), or give the inputs with --input NAME:SHAPE:DTYPE",
        )
    return binding


def check_state(
    ref: Runtime,
    cand: Runtime,
    binding: InputBinding,
    sample: dict[str, Any],
    probe_candidate: bool = True,
) -> StateCheck:
    """Which state one call changes, on copies of both models (the reference raising here is
    the model's own error)."""
    check = StateCheck()
    if ref.module is not None and ref.call_of is not None:
        check.reference = state_changes(ref.module, ref.call_of, sample, "the reference model")
    if probe_candidate and cand.module is not None and cand.call_of is not None:
        renamed = binding.renamed
        try:
            check.candidate = state_changes(
                cand.module,
                cand.call_of,
                {renamed.get(k, k): v for k, v in sample.items()},
                "the candidate",
            )
        except Exception:  # a candidate that does not run is compare's finding (fail_to_run)
            check.candidate = None
    return check


def verify(
    reference: str | Path,
    candidate: str | Path,
    opts: Options | None = None,
    *,
    batch_sizes: list[int] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    warn_only: bool = False,
    device: str = "cpu",
    input_map: dict[str, str] | None = None,
) -> VerifyReport:
    """Compare ``candidate`` with ``reference``; VerificationError unless they agree.

    ``device="cuda"`` runs the candidate on the GPU against the CPU reference (and its fp64 run).
    ``input_map`` feeds reference input REF to the candidate as CAND (``{REF: CAND}``).
    A model that raises on the example inputs is a ModelRaisedError (exit code 4).
    """
    opts = opts or Options()
    refuse_unsafe(reference, candidate)
    try:
        return _verify(
            reference, candidate, opts, batch_sizes, atol, rtol, warn_only, device, input_map
        )
    except ModelRaisedError as exc:
        if exc.path is None:  # run_model does not know the file: the reference's it is
            exc.path = str(reference)
        raise


def _verify(
    reference: str | Path,
    candidate: str | Path,
    opts: Options,
    batch_sizes: list[int] | None,
    atol: float | None,
    rtol: float | None,
    warn_only: bool,
    device: str,
    input_map: dict[str, str] | None,
) -> VerifyReport:
    ref = open_runtime(reference, opts)
    cand = open_runtime(candidate, opts)
    if ref.call is None and cand.call is None:
        from ptconvert.verify.weights import verify_weights
        from ptconvert.weights.read import read_weights

        if input_map:
            raise UsageError("--input-map applies to programs: weights are compared by name")
        # read as the conversion read it: the same entry (--key), the same prefix strip
        source = read_weights(Path(reference), key=opts.key, keep_prefix=opts.keep_prefix)
        try:
            check = verify_weights(source, Path(candidate))
        except VerificationError:
            if not warn_only:
                raise
            check = WeightsCheck("fail")
        return VerifyReport(str(reference), str(candidate), "weights", check.status, weights=check)
    if ref.call is None or cand.call is None:
        missing = reference if ref.call is None else candidate
        raise MissingRequirementError(
            "a weights file can only be compared with a program once it is a module",
            path=missing,
            hint="pass --model pkg.module:factory (or a directory with config.json)",
        )
    inputs = ref.inputs or cand.inputs
    given = bool(opts.inputs or opts.example_inputs)
    if not given and cand.exported is not None and not cand.dynamic and cand.inputs is not None:
        # a program with fixed shapes runs on its own sample inputs' shapes only
        inputs = cand.inputs
    if inputs is None:
        raise MissingRequirementError(
            "no example inputs: the reference and the candidate define none",
            path=reference,
            hint="pass --input NAME:SHAPE:DTYPE (repeatable) or --example-inputs FILE",
        )
    # sizes both sides take: a fixed-shape reference (an ONNX graph of batch 2) fixes them too
    dynamic = cand.dynamic and ref.dynamic
    batches, said = batches_to_compare(
        batch_sizes, dynamic, inputs.batch, max_batch=None if batch_sizes else cand.max_batch
    )
    values = inputs.at(inputs.batch)
    binding = bind_inputs(list(values), ref, cand, input_map, values)
    if cand.exported is not None:  # only the inputs whose dim 0 is its dynamic batch resize
        inputs = pinned(inputs, _unbatched(cand.exported, binding, inputs))
    make = binding.make(inputs.at)
    notes = [*binding.notes, *said]
    if binding.left_out:
        notes.append(
            f"not fed to either side (the candidate does not take them): {binding.left_out}"
        )
    # the candidate is probed on the CPU only: elsewhere it runs where --device puts it
    state = (
        check_state(ref, cand, binding, make(min(batches)), device == "cpu") if batches else None
    )
    reference_call: Any = ref.call
    candidate_runtime = cand
    if state is not None and state.candidate and not state.reference:
        # the candidate drifts where the reference does not: calling it as it is shows that
        notes.append(
            f"the candidate changes its state on a call ({state.candidate}) and the reference "
            "does not: the candidate was called as it is"
        )
    if state is not None and state.reference:
        # one call changes the model: compare every call from the same (saved) state
        assert ref.module is not None and ref.call_of is not None
        reference_call, fresh, resettable = stateful_sides(
            ref.module, ref.call_of, cand.call, cand.module, cand.call_of
        )
        candidate_runtime = dataclasses.replace(cand, call=fresh)
        how = (
            f"both were run {STATEFUL_CALLS} times in a row from their initial (saved) state, "
            "on fresh copies, and every call's outputs compared (a wrong state update shows "
            "in the later calls)"
            if resettable
            else "every call ran on a fresh copy of the reference; the candidate "
            f"({cand.format}) runs in another process and cannot be reset: it was called as it is"
        )
        state.compared = how
        notes.append(
            f"stateful model: one call changes the reference's {state.reference}"
            + (f" and the candidate's {state.candidate}" if state.candidate else "")
            + f"; {how}"
        )
    elif state is not None and state.reference is None and ref.module is not None:
        notes.append("the reference's state was not checked: the module cannot be copied")
    elif state is not None:
        state.compared = "called as they are: a call changes no state of the reference"
    candidate_call = binding.for_candidate(on_device(candidate_runtime, device))
    # every dynamic dim at its ends and between; the batch sizes are those that hold
    ranged = cand.exported if not batch_sizes and ref.dynamic else None
    judged = judge_program(
        reference_call,
        candidate_call,
        make,
        batches,
        ranged,
        lambda: make(inputs.batch),
        rename={c: e for e, _, c in binding.fed},
        # eager twice at every size: a foreign reference's nondeterminism is never compared
        determinism="each",
        atol=atol,
        rtol=rtol,
    )
    parity, ranges, batches = judged.parity, judged.ranges, [s.batch for s in judged.parity.sizes]
    if ranges is not None and ranges.status == "narrowed":
        notes.append("the program runs on part of the range torch reports: see ranges")
    if (skipped := parity.skipped_note()) is not None:
        notes.append(skipped)
    if parity.compared == 0:
        notes.append("nothing was compared: " + _nothing_compared(parity))
    report = VerifyReport(
        str(reference),
        str(candidate),
        "program",
        parity.status,
        batches,
        parity,
        environment={**environment(), "device": device},
        inputs_fed=[r for _, r, _ in binding.fed],
        inputs_left_out=binding.left_out,
        input_map=binding.renamed,
        state=state,
        notes=notes,
        ranges={r.dim.where: r.text for r in ranges.dims} if ranges is not None else {},
    )
    wrong = judged.wrong
    if wrong and parity.status == "pass":
        report.status = "fail_accuracy"  # it takes those sizes and computes something else
        if not warn_only:
            raise VerificationError(
                "the candidate runs at sizes outside the range that holds and returns other "
                "outputs than the reference there: "
                + "; ".join(f"{r.dim.where} at {r.wrong[:4]} ({r.text})" for r in wrong),
                path=candidate,
                hint="a program must refuse the sizes it is wrong at: ptconvert's conversion "
                "exports it again with the range that holds; --warn-only reports without failing",
            )
    if ranges is not None and ranges.status == "fail" and parity.status == "pass":
        report.status = "fail_to_run"  # right at the example sizes, at no other
        if not warn_only:
            raise VerificationError(
                "a dynamic dimension gives the reference's result at no size checked: "
                + "; ".join(ranges.texts),
                path=candidate,
            )
    if parity.status != "pass" and not warn_only:
        bad = parity.failed[0] if parity.failed else None
        if bad is None:
            raise VerificationError(
                f"nothing was compared between {candidate} and {reference}",
                path=candidate,
                hint="pass --batch-sizes",
            )
        if bad.status == "eager_nondeterministic":
            raise VerificationError(
                f"{reference} gave different outputs on two runs of the same inputs at batch "
                f"{bad.batch} (eager_nondeterministic): nothing was compared there",
                path=candidate,
                hint="make the reference deterministic (eval mode, no dropout or random ops); "
                "--warn-only reports without failing",
            )
        raise VerificationError(
            f"differs from {reference} at batch {bad.batch}: {bad.status} ({bad.detail})",
            path=candidate,
            hint="--warn-only reports without failing; --atol/--rtol override the tolerances",
        )
    return report


def _unbatched(exported: Any, binding: InputBinding, inputs: Any) -> list[str]:
    """The example's tensor inputs whose dim 0 is not the program's dynamic batch."""
    from ptconvert.verify.dims import dynamic_dims

    batched = {d.input for d in dynamic_dims(exported) if d.axis == 0}
    sample = inputs.at(inputs.batch)
    tensors = [n for n, v in sample.items() if getattr(v, "dim", lambda: 0)() > 0]
    fed = {e: c for e, _, c in binding.fed}
    return [n for n in tensors if fed.get(n, n) not in batched]


_WHY_NOT_COMPARED = {
    "eager_nondeterministic": "the reference gave different outputs on two runs of the same inputs",
    "fail_to_run": "the candidate failed to run",
}


def _nothing_compared(parity: ParityReport) -> str:
    """Why no size was compared, from the sizes' statuses."""
    reasons = dict.fromkeys(_WHY_NOT_COMPARED.get(s.status, s.status) for s in parity.sizes)
    return "; ".join(reasons) or "no batch size to run"


def require_device(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise MissingRequirementError(
            "--device cuda: CUDA is not available on this machine",
            hint="run on a machine with a GPU, or use --device cpu",
        )


def on_device(runtime: Any, device: str) -> Any:
    """The runtime's call with its module and inputs on ``device`` and outputs back on the CPU."""
    if device == "cpu":
        return runtime.call
    import torch

    require_device(device)
    if getattr(runtime, "isolated", False):
        return runtime.call  # opened for the device: it moves its inputs there itself
    if runtime.module is None:
        raise MissingRequirementError(
            f"{runtime.format} runs on the CPU only here", path=runtime.path
        )
    runtime.module.to(device)

    def call(**kwargs: Any) -> Any:
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        out = runtime.call(**moved)
        return _compat.torch_api.pytree().tree_map(
            lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, out
        )

    return call
