"""The one program check: a candidate program against its reference, as a conversion judges
what it wrote (``convert/program_check``) and ``ptconvert verify`` judges a foreign artifact
(``verify/check``), in the same order and by the same rules:

1. a stateful reference (a call changes its buffers): both sides compared from their saved
   state, ``STATEFUL_CALLS`` calls in a row when the candidate can be reset (``stateful_sides``);
2. the batch sizes compared, chosen by one policy (``batches_to_compare``: the example's for a
   static batch, the sizes asked for, else 1, 2, 3 and larger while they are cheap), eager's
   outputs kept in one ``EagerRuns``;
3. every dynamic dim of the program probed at its ends and between (``verify.ranges``), the
   sizes compared already taken as judged;
4. the sizes inside the range that holds compared (those missing run now), the others left out.

What a failure means is the caller's: a conversion exports again with the range that holds or
refuses; ``verify`` reports. A generation export is judged by ``judge_generation`` ("generates
like transformers": tokens and each step's logits, precision noise told by the fp64 logits).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ptconvert import progress
from ptconvert.errors import ModelRaisedError
from ptconvert.report import Report
from ptconvert.verify.model_state import STATEFUL_CALLS, attributes_restored, fresh_each_call
from ptconvert.verify.parity import (
    VARIED_BATCHES,
    Determinism,
    EagerRuns,
    ParityReport,
    compare,
    summarised,
)


def batches_to_compare(
    asked: list[int] | None,
    dynamic: bool,
    example: int,
    *,
    cost: Callable[[list[int]], float] | None = None,
    seconds: float | None = None,
    max_batch: int | None = None,
) -> tuple[list[int], list[str]]:
    """The batch sizes a check compares, and notes on those it leaves: the one policy of a
    conversion's check and of ``ptconvert verify``. A static batch: the example's only (sizes
    asked for are not sizes the program takes: said). Sizes asked for (``--batch-sizes``): those.
    Else ``VARIED_BATCHES``: 1, 2 and 3 always, the larger ones while ``cost`` (seconds to
    compare a list of sizes) of every size kept, 1, 2 and 3 included, fits ``seconds``; at most
    ``max_batch``, which is compared too (where an off-by-one specialisation shows)."""
    if not dynamic:
        said = [
            f"compared at batch {example} only, not at --batch-sizes: the program's batch is "
            "static (--dynamic-batch makes it dynamic)"
        ]
        return [example], said if asked else []
    if asked:
        return list(dict.fromkeys(asked)), []
    kept: list[int] = []
    left: list[int] = []
    for b in VARIED_BATCHES:
        # 1, 2 and 3 are not optional, but they spend the check's time first: a model whose
        # three sizes fill its share is compared at those only
        fits = cost is None or seconds is None or cost([*kept, b]) <= seconds
        (kept if b <= 3 or fits else left).append(b)
    notes = []
    if left and cost is not None:
        notes.append(
            f"compared at batch sizes {kept}: {left} would take about {cost(left):.0f} s more "
            "(sizes are chosen by the model's call time; --batch-sizes chooses them)"
        )
    if max_batch:
        kept = sorted(b for b in {*kept, max_batch} if b <= max_batch)
    return kept, notes


@dataclass
class Judgement:
    """What a program check found: the comparison at the sizes that hold, and the dynamic
    dims' ranges (None: the program has none)."""

    parity: ParityReport
    ranges: Any = None  # verify.range_findings.RangeReport
    dropped: list[int] = field(default_factory=list)  # sizes asked for, outside the range

    @property
    def wrong(self) -> list[Any]:
        """The dims the program runs at sizes where it computes something else."""
        return [r for r in self.ranges.dims if r.wrong] if self.ranges is not None else []


def stateful_sides(
    reference: Any,
    reference_call_of: Callable[[Any], Callable[..., Any]],
    candidate: Callable[..., Any],
    candidate_module: Any,
    candidate_call_of: Callable[[Any], Callable[..., Any]] | None,
) -> tuple[Any, Callable[..., Any], bool]:
    """The calls to compare when one call changes the reference's state: each from the saved
    state, ``STATEFUL_CALLS`` in a row on both sides when the candidate can be copied and so
    reset (every call's outputs compared: a wrong state update shows in the later ones), else
    each size on the reference's first call and the candidate called as it is. The third value
    says whether the candidate was reset."""
    if candidate_module is not None and candidate_call_of is not None:
        return (
            fresh_each_call(reference, reference_call_of, STATEFUL_CALLS),
            fresh_each_call(candidate_module, candidate_call_of, STATEFUL_CALLS),
            True,
        )
    return fresh_each_call(reference, reference_call_of, 1), candidate, False


def judge_program(
    reference: Any,
    candidate: Callable[..., Any],
    make: Callable[[int], dict[str, Any]],
    batches: list[int],
    ranged: Any,
    example: Callable[[], dict[str, Any]],
    *,
    eager: EagerRuns | None = None,
    determinism: Determinism = "once",
    budget: int | None = None,
    seconds: float | None = None,
    shared: bool = True,
    rename: dict[str, str] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    accuracy: tuple[float, float] | None = None,
) -> Judgement:
    """Compare ``candidate`` with ``reference`` at ``batches`` and, when ``ranged`` (the
    candidate's ExportedProgram) has dynamic dims, probe each of them on ``example()``; the
    sizes outside the batch range that holds are dropped, those inside compared (``seconds``:
    the time the comparisons and then the probes' optional sizes may take together, from this
    call: the probes get what the comparisons left, ``ranges.check_ranges``; not ``shared``:
    the probes get all of it, as when the sizes compared are the user's). ``accuracy``
    (min cosine, max error): every comparison, probes included, judges by them (a program
    quantized after its export) instead of by a tolerance."""
    from ptconvert.verify.dims import dynamic_dims
    from ptconvert.verify.probes import DEFAULT_BUDGET, shapes_of
    from ptconvert.verify.range_findings import verdict
    from ptconvert.verify.ranges import batch_sizes_that_hold, check_program

    started = time.monotonic()
    runs = eager if eager is not None else EagerRuns(made_by=make)
    # the sizes and probes each start from the reference's own attributes (Swin's window)
    reference = attributes_restored(reference)
    dynamic = ranged is not None and bool(dynamic_dims(ranged))
    report: ParityReport | None = None
    try:
        report = compare(
            reference,
            candidate,
            make,
            batches,
            determinism=determinism,
            eager=runs,
            atol=atol,
            rtol=rtol,
            accuracy=accuracy,
        )
    except ModelRaisedError:
        if not dynamic:
            raise
        # eager itself fails at one of the sizes: the range check says which hold first
    if not dynamic:
        assert report is not None
        return Judgement(report)
    # the sizes compared are judged already, unless one computed something else than eager
    # (then its shape is probed on the example's own rows: a value a trace froze is not a size
    # the program rejects); None: eager failed at one of them, nothing is known
    known = None
    judged = [s for s in report.sizes if s.status != "skipped"] if report is not None else []
    if report is not None and all(s.status in ("pass", "fail_to_run") for s in judged):
        known = {shapes_of(runs.inputs[s.batch]): verdict(s) for s in judged}
    if not shared:
        started = time.monotonic()
    with progress.step("checking every dynamic dimension at its ends"):
        # probes are keyed by their index: each judgement starts its own eager outputs
        judge = partial(
            compare,
            reference,
            candidate,
            determinism="done" if runs.deterministic else "once",
            atol=atol,
            rtol=rtol,
            accuracy=accuracy,
        )
        ranges = check_program(
            ranged,
            example(),
            judge,
            rename,
            budget=budget or DEFAULT_BUDGET,
            known=known,
            seconds=None if seconds is None else max(0.0, seconds - time.monotonic() + started),
        )
    if not ranges.dims:
        assert report is not None
        return Judgement(report, ranges)
    held = batch_sizes_that_hold(ranges, batches)
    done = {s.batch: s for s in report.sizes} if report is not None else {}
    missing = [b for b in held if b not in done]
    if missing:  # the range's minimum when none of ``batches`` was inside
        more = compare(
            reference,
            candidate,
            make,
            missing,
            determinism=determinism,
            eager=runs,
            atol=atol,
            rtol=rtol,
            accuracy=accuracy,
        )
        done.update({s.batch: s for s in more.sizes})
        report = report or more
    assert report is not None
    parity = summarised([done[b] for b in held], report.fp64_reference, report.tolerance)
    return Judgement(parity, ranges, [b for b in batches if b not in held])


@dataclass
class GenerationRun(Report):
    """One greedy run of a generation export against transformers' (``judge_generation``)."""

    batch: int
    prompt_length: int  # a speech model's: the feature input's number (FEATURE_INPUTS)
    new_tokens: int
    status: str  # pass | noise (within eager's fp64 error) | tie | fail_tokens | fail_logits
    max_abs_error: float = 0.0
    distinct_tokens: int = 0
    detail: str = ""


def _noise(ours: Any, theirs: Any, gold: Any, tolerance: float) -> bool:
    """Outside allclose but no further from the float64 truth than eager is (parity's rule:
    RMSE against fp64 at most 2× eager's, 3× for fewer than 1000 values, plus tol/10)."""

    def rmse(x: Any) -> float:
        return float(((x.double() - gold.double()) ** 2).mean().sqrt())

    multiplier = 3.0 if ours.numel() < 1000 else 2.0
    return rmse(ours) <= multiplier * rmse(theirs) + tolerance / 10


def judge_generation(
    mine: Any,
    reference: Any,
    prompt_length: int,
    batch: int,
    tolerance: float,
    gold: Any = None,
) -> GenerationRun:
    """ "Generates like transformers": one greedy run (``mine``: sequences and each step's
    logits) against transformers' (``reference``), tokens row by row, logits step by step. A step's
    logits outside allclose pass when ``gold()`` (the float64 logits per step, or None) says
    they are as close to the truth as eager's."""
    import torch

    truth: list[Any] | None = None

    got = mine.sequences[:, -len(mine.logits) :]  # the new tokens of each
    want = reference.sequences[:, -len(reference.logits) :]
    steps = min(len(mine.logits), len(reference.logits))
    worst, status, detail = 0.0, "pass", ""
    for row in range(batch):
        for k in range(steps):
            ours, theirs = mine.logits[k][row].float(), reference.logits[k][row].float()
            error = float((ours - theirs).abs().max())
            worst = max(worst, error)
            if not torch.allclose(ours, theirs, atol=tolerance, rtol=tolerance):
                if truth is None and gold is not None:
                    truth = gold() or []
                if truth and _noise(ours, theirs, truth[k][row], tolerance):
                    status = "noise" if status == "pass" else status
                    continue
                return GenerationRun(
                    batch, prompt_length, steps, "fail_logits", worst, _distinct(got),
                    f"row {row}, new token {k}: logits differ by up to {error:.3g} "
                    f"(tolerance {tolerance:g})",
                )  # fmt: skip
            if int(got[row, k]) != int(want[row, k]):
                best = float(theirs.max())
                if float(theirs[int(got[row, k])]) >= best - tolerance * (1 + abs(best)):
                    status = "tie"
                    detail = (
                        f"row {row}, new token {k}: {int(got[row, k])} and transformers' "
                        f"{int(want[row, k])} tie within the tolerance; compared up to there"
                    )
                    break
                return GenerationRun(
                    batch, prompt_length, steps, "fail_tokens", worst, _distinct(got),
                    f"row {row}, new token {k}: {int(got[row, k])}, transformers chose "
                    f"{int(want[row, k])}",
                )  # fmt: skip
    return GenerationRun(batch, prompt_length, steps, status, worst, _distinct(got), detail)


def _distinct(tokens: Any) -> int:
    return len(set(tokens.flatten().tolist()))
