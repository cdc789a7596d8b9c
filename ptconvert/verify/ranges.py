"""Which sizes a torch.export program really runs at along its dynamic dimensions.

``ep.range_constraints`` is what torch *guarantees*, and it is not the whole truth: a program
exported with ``Dim.DYNAMIC(min=12, max=2048)`` on a height can still carry a shape guard
(``-3 + (-3 + x.size()[2]) // 2 != 1``, from an intermediate size that must not be 1) that
rejects 12, and a ``view(..., -1, 2)`` makes every odd size fail although the range says
"2 or more". This module runs the probes (:mod:`probes`: where; :mod:`shape_guards`: where the
program's own guards draw the edges) through a ``parity.compare``-like judge
(:func:`check_ranges`), narrowing a range that does not hold to the part that does, and says
per dim which range holds (:mod:`range_findings`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ptconvert import progress
from ptconvert.report import Report
from ptconvert.verify.dims import DynamicDim, describe, dynamic_dims
from ptconvert.verify.probes import (
    DEFAULT_BUDGET,
    Group,
    Key,
    Point,
    Shapes,
    example_sizes,
    groups_of,
    middle,
    probed_at_one,
    resize,
    shapes_at,
    tie_alike,
)
from ptconvert.verify.range_findings import (
    DimRange,
    GroupFindings,
    RangeReport,
    dim_results,
    verdict,
)
from ptconvert.verify.shape_guards import GuardSet, shape_guards

# judge(make_inputs, keys) → a ParityReport-like object: ``.sizes`` with ``.status``/``.detail``
# per key (``functools.partial(parity.compare, reference, candidate)`` is one)
Judge = Callable[[Callable[[int], dict[str, Any]], list[int]], Any]

SCAN_LIMIT = 8192  # symbol values whose guards are evaluated per dim (two windows beyond it)
_LADDER = 6  # extra probes per range end and narrowing round
_MAX_STEP = 64  # the largest step ("multiples of 64") recognised in the guards


@dataclass
class RunResult(Report):
    """One probe as :func:`runs` judges it (shaped like parity's SizeResult)."""

    batch: int  # the probe's key
    status: str  # "pass" | "fail_to_run"
    detail: str = ""


@dataclass
class RunReport(Report):
    status: str
    sizes: list[RunResult] = field(default_factory=list)


def runs(candidate: Callable[..., Any]) -> Judge:
    """A judge that only asks whether ``candidate`` runs (no reference to compare with)."""

    def judge(make_inputs: Callable[[int], dict[str, Any]], keys: list[int]) -> RunReport:
        sizes = []
        for k in keys:
            try:
                candidate(**make_inputs(k))
            except Exception as exc:  # the finding: this size does not run
                sizes.append(RunResult(k, "fail_to_run", f"{type(exc).__name__}: {exc}"))
                continue
            sizes.append(RunResult(k, "pass"))
        return RunReport(next((s.status for s in sizes if s.status != "pass"), "pass"), sizes)

    return judge


def check_ranges(
    dims: Sequence[DynamicDim],
    example: dict[str, Any],
    judge: Judge,
    *,
    budget: int = DEFAULT_BUDGET,
    guards: GuardSet | None = None,
    rounds: int = 2,
    try_one: bool = True,
    known: dict[Shapes, str | None] | None = None,
    seconds: float | None = None,
) -> RangeReport:
    """Run the probe points through ``judge`` and say, per dynamic dim, which range holds.

    ``example``: the inputs at their example sizes (resized per point with :func:`resize`).
    ``judge(make_inputs, keys)`` judges ``make_inputs(k)`` for every key (the probe's index)
    and returns an object with ``.sizes`` in key order, each with ``.status`` ("pass" or not)
    and ``.detail`` — ``functools.partial(parity.compare, reference, candidate)``, or
    :func:`runs` when there is no reference. ``guards`` (:func:`shape_guards`) place the probes
    on the edges the guards draw. A failing end is narrowed by up to ``rounds`` more batches
    of probes. With ``try_one``, a dim whose guaranteed minimum is 2 (torch's floor for a
    dynamic dim) is also run at size 1; the result is reported beside the range, never in it.
    ``known``: verdicts already judged at some shapes (``shapes_of`` the inputs; None for a
    pass): a probe at those shapes takes the verdict instead of running.
    ``seconds``: the time the optional probes may take (each dim's top, the guards' upper
    edge, the narrowing rounds, every dim at its smallest together), run one by one while it
    lasts; each dim's smallest size, a middle one, the first size its guards admit and size 1
    run whatever they cost. A top left unrun is said as "checked up to" the largest that ran.
    Each probe is a progress step naming its dim and size.
    """
    sizes0 = example_sizes(dims, example)
    groups, loose = groups_of(dims, sizes0, budget)
    shapes0 = {k: tuple(v.shape) for k, v in example.items() if hasattr(v, "shape")}
    for g in groups:
        g.top = _judged_top(g, shapes0, known or {})
    states = [GroupFindings(g) for g in groups]
    probes = 0
    began = time.monotonic()
    deadline = None if seconds is None else began + seconds
    # a failing end is narrowed for NARROWING_SECONDS at least: the bounds a format exported
    # again with come from it, and a range left wide refuses sizes that run
    narrowing_until = None if deadline is None else max(deadline, began + NARROWING_SECONDS)
    cost = _ProbeCost()

    def run(points: list[Point], names: list[str], until: float | None = None) -> list[str | None]:
        """Each point's verdict; with ``until`` (optional points), one expected to end after
        it (``cost``, by its inputs' size) is ``_UNRUN``."""
        nonlocal probes
        out: list[str | None] = []
        for point, name in zip(points, names, strict=True):
            at = shapes_at(shapes0, point)
            if at in (known or {}):
                out.append((known or {})[at])
                continue
            size = _elements(at)
            if until is not None and time.monotonic() + cost.expected(size) >= until:
                out.append(_UNRUN)
                continue
            probes += 1
            started = time.monotonic()
            with progress.step(f"checking {name}"):
                found = _alone(judge, example, [point], 0)
            if found is None:  # a probe that ran through: a failure may have stopped early
                cost.add(size, time.monotonic() - started)
            out.append(found)
        return out

    def probe(batch: list[tuple[GroupFindings, int | str]], until: float | None = None) -> None:
        names = [_probe_name(st, v) for st, v in batch]
        _record(batch, run([_point(st, v) for st, v in batch], names, until))

    # first: every group's smallest, a middle and the first size its guards admit (and 1);
    # then its top and the guards' last admitted size, while the time lasts
    at_one = {d.key for d in probed_at_one(dims)}
    first: list[tuple[GroupFindings, int | str]] = []
    later: list[tuple[GroupFindings, int | str]] = []
    for st in states:
        if guards is not None:
            _scan(st, guards, shapes0, frozenset(d.key for d in dims))
        values, optional = _first_values(st)
        first += [(st, v) for v in values]
        later += [(st, v) for v in optional if v not in values]
        if try_one and st.group.lo == 2 and all(d.key in at_one for d in st.group.dims):
            first.append((st, "one"))
    probe(first)
    probe(later, deadline)
    for _ in range(rounds):
        batch = [(st, v) for st in states for v in _narrowing(st)]
        if not batch:
            break
        probe([(st, v) for st, v in batch], narrowing_until)
    for st in states:  # a top the time left unrun: what is known ends at the largest that ran
        g = st.group
        unrun = g.top not in (*st.passed, *st.failed, *st.rejected)
        if unrun and st.passed and not any(v > max(st.passed) for v in st.failed):
            g.top = max(st.passed)
    joint = None
    if len(states) > 1 and all(st.passed for st in states):
        point = {k: s for st in states for k, s in st.group.point(min(st.passed)).items()}
        (verdict,) = run([point], ["every dynamic dim at its smallest together"], deadline)
        if verdict is not None and verdict != _UNRUN:
            joint = "every dynamic dim at its smallest size that ran, together: " + verdict
    results = [r for st in states for r in dim_results(st)]
    results += [DimRange(d, "not_checked", text=f"{describe(d)} (not checked)") for d in loose]
    statuses = {r.status for r in results}
    status = "fail" if "fails" in statuses else "pass"
    if status == "pass" and ("narrowed" in statuses or joint is not None):
        status = "narrowed"
    return RangeReport(status, results, joint, probes)


NARROWING_SECONDS = 20.0


@dataclass
class _ProbeCost:
    """What a probe is expected to take by its inputs' size: the line through the smallest and
    the largest probes that ran through (a fixed cost, an onnxruntime call's, and a cost per
    element), or in proportion to the one."""

    runs: list[tuple[int, float]] = field(default_factory=list)

    def add(self, size: int, seconds: float) -> None:
        self.runs.append((size, seconds))

    def expected(self, size: int) -> float:
        if not self.runs:
            return 0.0
        (s0, t0), (s1, t1) = min(self.runs), max(self.runs)
        if s1 <= s0:
            return t1 * size / max(1, s1)
        per = max(0.0, (t1 - t0) / (s1 - s0))
        return max(0.0, t1 + per * (size - s1))


def _elements(shapes: Shapes) -> int:
    """How many elements the inputs of these shapes hold together."""
    return sum(math.prod(shape) for _, shape in shapes)


_UNRUN = "\0unrun"  # an optional probe the check's time left out (never recorded)


def _probe_name(st: GroupFindings, v: int | str) -> str:
    d = st.group.dims[0]
    size = d.size_at(1) if v == "one" else d.size_at(int(v))
    what = f" ({d.label})" if d.label != "any size" else ""
    return f"{d.where}{what} at {size}"


def _judged_top(
    g: Group, shapes0: dict[str, tuple[int, ...]], known: dict[Shapes, str | None]
) -> int:
    """The group's top, raised to the largest value judged already along it (a batch size
    compared above the cost-bounded top) that passed, inside the guaranteed range: that size
    ran, and a probe at a lower top would run the model again to prove less."""
    best = g.top
    for shapes, why in known.items():
        sizes = dict(shapes)
        for d in g.dims:
            shape = sizes.get(d.input)
            v = d.value_of(shape[d.axis]) if shape is not None and d.axis < len(shape) else None
            if v is None or v <= best or (g.hi is not None and v > g.hi) or why is not None:
                continue
            if shapes_at(shapes0, g.point(v)) == shapes:  # the other dims at the example's
                best = v
    return best


def _judged(
    judge: Judge, example: dict[str, Any], points: list[Point], keys: range
) -> list[str | None]:
    """None per point that passed, else the judge's status and detail."""
    report = judge(lambda i: resize(example, points[i]), list(keys))
    by_key = {getattr(s, "batch", i): s for i, s in zip(keys, report.sizes, strict=False)}
    out: list[str | None] = []
    for i in keys:
        s = by_key.get(i)
        out.append("not judged" if s is None else verdict(s))
    return out


def _alone(judge: Judge, example: dict[str, Any], points: list[Point], i: int) -> str | None:
    try:
        return _judged(judge, example, points, range(i, i + 1))[0]
    except Exception as exc:  # compare lets the reference's own errors through
        text = (str(exc).splitlines() or [""])[0]  # ModelRaisedError: "the reference model …"
        if not text.startswith("the reference"):
            text = f"the reference fails here too: {type(exc).__name__}: {text}"
        return text[:300]


def _point(st: GroupFindings, v: int | str) -> Point:
    return st.group.point(1) if v == "one" else st.group.point(int(v))


def _record(batch: list[tuple[GroupFindings, int | str]], verdicts: list[str | None]) -> None:
    for (st, v), why in zip(batch, verdicts, strict=True):
        if why == _UNRUN:
            continue
        if v == "one":
            st.one, st.one_detail = why is None, why or ""
        elif why is None:
            st.passed.add(int(v))
        else:
            st.failed[int(v)] = why


def _scan(
    st: GroupFindings,
    guards: GuardSet,
    shapes0: dict[str, tuple[int, ...]],
    dynamic: frozenset[Key],
) -> None:
    """Evaluate the guards that read only this group's dims (and static sizes) over its span:
    which symbol values they reject, and whether the admitted ones step ("even sizes only").
    A guard that also reads another group's dim is a relation between dims: not judged here."""
    g = st.group
    if g.top - g.lo <= SCAN_LIMIT:
        values = list(range(g.lo, g.top + 1))
    else:  # both ends of a long span
        half = SCAN_LIMIT // 2
        values = [*range(g.lo, g.lo + half), *range(g.top - half + 1, g.top + 1)]
    own = frozenset(d.key for d in g.dims)
    every = frozenset((name, axis) for name, shape in shapes0.items() for axis in range(len(shape)))
    allowed = (every - dynamic) | own
    for v in values:
        shapes = dict(shapes0)
        for (name, axis), size in g.point(v).items():
            if name in shapes:
                shape = list(shapes[name])
                shape[axis] = size
                shapes[name] = tuple(shape)
        why = guards(shapes, only=allowed, touching=own)
        if why is not None:
            st.rejected[v] = why
    st.scanned = values
    st.ties = guards.ties(own, dynamic)
    admitted = [v for v in values if v not in st.rejected]
    if admitted and st.rejected:
        st.step = _stride(values, admitted)


def _stride(values: list[int], admitted: list[int]) -> int:
    """The smallest step m with: admitted == every m-th scanned value from the first admitted
    one to the last; 1 when there is none (holes without a pattern)."""
    first, last = admitted[0], admitted[-1]
    inside = [v for v in values if first <= v <= last]
    chosen = set(admitted)
    for m in range(2, _MAX_STEP + 1):
        if all((v in chosen) == ((v - first) % m == 0) for v in inside):
            return m
    return 1


def _first_values(st: GroupFindings) -> tuple[list[int], list[int]]:
    """The sizes every check runs (the smallest, a middle one, the first size the guards admit)
    and those it runs while its time lasts (the top, the last size the guards admit)."""
    g = st.group
    ok = (lambda v: v not in st.rejected) if st.rejected else (lambda v: True)
    values, optional = [g.lo], [g.top]
    admitted = [v for v in st.scanned if ok(v)]
    if st.rejected and admitted:  # the guards' edges too: run where they say it starts
        values.append(admitted[0])
        optional.append(admitted[-1])
    mid = middle(g.lo, g.top, g.example)
    if mid is not None:
        values.append(mid)
        if not ok(mid):  # the odd middle is rejected ("even only"): one the guards admit too
            alt = middle(g.lo, g.top, g.example, ok)
            if alt is not None:
                values.append(alt)
    return list(dict.fromkeys(values)), list(dict.fromkeys(optional))


def _narrowing(st: GroupFindings) -> list[int]:
    """Probes between a failing end and the nearest size that ran, while a gap is open."""
    if not st.passed:
        return []
    known_bad = {**st.rejected, **st.failed}
    lo_ok, hi_ok = min(st.passed), max(st.passed)
    below = [v for v in known_bad if v < lo_ok]
    above = [v for v in known_bad if v > hi_ok]
    out = _ladder(max(below), lo_ok, st) if below else []
    return out + (_ladder(min(above), hi_ok, st) if above else [])


def _ladder(bad: int, good: int, st: GroupFindings) -> list[int]:
    """Values between a failing and a passing one, on the passing one's step: 1, 2, 4 … 16
    steps from the failing side (failures cluster at the ends) and the midpoint."""
    step = st.step
    gap = abs(good - bad)
    toward = 1 if good > bad else -1
    raw = [bad + toward * d for d in (1, 2, 4, 8, 16)] + [bad + toward * (gap // 2)]
    out: list[int] = []
    for r in raw:
        v = good - toward * step * (abs(good - r) // step)  # snapped onto good's step
        if 0 < abs(good - v) < gap and v not in (*out, *st.passed, *st.failed, *st.rejected):
            out.append(v)
    return out[:_LADDER]


def check_program(
    ep: Any,
    example: dict[str, Any],
    judge: Judge,
    rename: dict[str, str] | None = None,
    budget: int = DEFAULT_BUDGET,
    known: dict[Shapes, str | None] | None = None,
    seconds: float | None = None,
) -> RangeReport:
    """Every dynamic dim of ``ep`` checked on ``example`` (named as the caller names its inputs:
    ``rename`` maps the program's input names to those), dims the model takes together moved
    together, the program's own guards placing the probes (``seconds``: ``check_ranges``)."""
    import dataclasses

    dims = dynamic_dims(ep)
    if rename:
        dims = [dataclasses.replace(d, input=rename.get(d.input, d.input)) for d in dims]
    dims = tie_alike(dims, example_sizes(dims, example))
    guards = shape_guards(ep, rename)
    return check_ranges(
        dims, example, judge, budget=budget, guards=guards, known=known, seconds=seconds
    )


def batch_sizes_that_hold(report: RangeReport, batches: list[int]) -> list[int]:
    """The sizes of ``batches`` inside the range that holds for dim 0 (all of them when no
    batch dim is dynamic; the range's minimum when none is inside)."""
    batch = next((r for r in report.dims if r.dim.axis == 0), None)
    if batch is None or batch.low is None:
        return batches
    low, high, step, rest = batch.low, batch.high, batch.modulus, batch.remainder

    def holds(b: int) -> bool:
        in_range = low <= b and (high is None or b <= high) and b % step == rest % step
        return in_range or b in batch.also

    return [b for b in batches if holds(b)] or [low]
