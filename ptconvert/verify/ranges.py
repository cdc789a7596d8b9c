"""Which sizes a torch.export program really runs at along its dynamic dimensions.

``ep.range_constraints`` is what torch *guarantees*, and it is not the whole truth: a program
exported with ``Dim.DYNAMIC(min=12, max=2048)`` on a height can still carry a shape guard
(``-3 + (-3 + x.size()[2]) // 2 != 1``, from an intermediate size that must not be 1) that
rejects 12, and a ``view(..., -1, 2)`` makes every odd size fail although the range says
"2 or more". This module reads the dynamic dims (:func:`dynamic_dims`), says them in words
(:func:`describe`), picks the sizes worth running (:func:`probe_sizes`), makes inputs at those
sizes (:func:`resize`) and runs them through a ``parity.compare``-like judge
(:func:`check_ranges`), narrowing a range that does not hold to the part that does.

Probe points vary one symbol at a time (dims that share a symbol, or are derived from it, move
together; every other dim stays at its example size): the minimum, an odd value in between and
the maximum. A maximum that is unbounded, or more than ``budget`` × the example size, is
replaced by ``budget × max(example, 2)`` (default budget 16): the probe then costs at most
about ``budget`` times the example in work and memory for a model linear in that dim, and the
report says the guaranteed maximum was not run. Last, every dim at the smallest size that ran
for it is run together (probe_sizes lists every dim at its minimum).
When the program's own shape guards are readable (:func:`shape_guards`, torch's private
``ExportedProgram._guards_code``) they are evaluated over the probed span first, at no cost,
to place the probes on the edges they draw and to recognise a step ("even sizes only").
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ptconvert.report import Report
from ptconvert.verify.dims import DynamicDim, describe, dynamic_dims, range_words, span_words

Key = tuple[str, int]  # (input name, axis)
Point = dict[Key, int]  # sizes to set: (input, axis) → size
Shapes = tuple[tuple[str, tuple[int, ...]], ...]  # every tensor input's shape, by name
# judge(make_inputs, keys) → a ParityReport-like object: ``.sizes`` with ``.status``/``.detail``
# per key (``functools.partial(parity.compare, reference, candidate)`` is one)
Judge = Callable[[Callable[[int], dict[str, Any]], list[int]], Any]

DEFAULT_BUDGET = 16
SCAN_LIMIT = 8192  # symbol values whose guards are evaluated per dim (two windows beyond it)
_LADDER = 6  # extra probes per range end and narrowing round
_MAX_STEP = 64  # the largest step ("multiples of 64") recognised in the guards


# --- probe points ---------------------------------------------------------------------------


@dataclass
class _Group:
    """Dims that move together: one symbol, its range, and where it was at the example."""

    symbol: str
    dims: list[DynamicDim]
    lo: int
    hi: int | None  # guaranteed (None: unbounded)
    example: int
    top: int  # the largest value probed: hi, or the cost-bounded stand-in

    def point(self, value: int) -> Point:
        return {d.key: d.size_at(value) for d in self.dims}


def example_sizes(dims: Sequence[DynamicDim], inputs: dict[str, Any]) -> dict[Key, int]:
    """The example's size along every dynamic dim that it has."""
    out: dict[Key, int] = {}
    for d in dims:
        shape = getattr(inputs.get(d.input), "shape", None)
        if shape is not None and d.axis < len(shape):
            out[d.key] = int(shape[d.axis])
    return out


def tie_alike(dims: Sequence[DynamicDim], example: dict[Key, int]) -> list[DynamicDim]:
    """Dims of different inputs on the same axis with the same example size move together (a
    batch or a sequence length that ``input_ids`` and ``attention_mask`` share): torch may keep
    one symbol for each, but the model is only ever called with them equal."""
    import dataclasses

    out = list(dims)
    leaders: dict[tuple[int, int], DynamicDim] = {}
    for i, d in enumerate(out):
        if d.symbol is None or d.scale != 1 or d.offset != 0 or d.key not in example:
            continue
        lead = leaders.setdefault((d.axis, example[d.key]), d)
        if lead.symbol == d.symbol or lead.input == d.input:
            continue
        highs = [h for h in (lead.symbol_max, d.symbol_max) if h is not None]
        low, high = max(lead.symbol_min, d.symbol_min), min(highs, default=None)
        old = d.symbol
        out = [
            dataclasses.replace(o, symbol=lead.symbol, symbol_min=low, symbol_max=high)
            if o.symbol in (lead.symbol, old)
            else o
            for o in out
        ]
        leaders[(d.axis, example[d.key])] = out[i]
    return out


def _groups(
    dims: Sequence[DynamicDim], example: dict[Key, int], budget: int
) -> tuple[list[_Group], list[DynamicDim]]:
    """Groups by symbol; dims with no single affine symbol come back as not probed."""
    by: dict[str, list[DynamicDim]] = {}
    loose = []
    for d in dims:
        if d.symbol is None or d.scale <= 0:
            loose.append(d)
        else:
            by.setdefault(d.symbol, []).append(d)
    groups = []
    for symbol, members in by.items():
        lo = max(m.symbol_min for m in members)
        his = [m.symbol_max for m in members if m.symbol_max is not None]
        hi = min(his) if his else None
        seen = [m.value_of(example[m.key]) for m in members if m.key in example]
        at = next((v for v in seen if v is not None), lo)
        # cost bound: at most `budget` × the example (× 2 at least, for batch 1 examples)
        cap = max(budget * max(at, 2), lo)
        top = min(hi, cap) if hi is not None else cap
        groups.append(_Group(symbol, members, lo, hi, at, max(top, lo)))
    return groups, loose


def _middle(lo: int, hi: int, avoid: int, ok: Callable[[int], bool] = lambda v: True) -> int | None:
    """An odd value strictly between ``lo`` and ``hi`` near their geometric mean, not ``avoid``
    (the example already ran), that ``ok`` accepts; any value between when none is odd."""
    if hi - lo < 2:
        return None
    centre = max(lo + 1, min(hi - 1, math.isqrt(max(lo, 1) * hi)))
    for odd_first in (True, False):
        for delta in range(0, 64):
            for v in (centre + delta, centre - delta):
                if lo < v < hi and v != avoid and (v % 2 == 1 or not odd_first) and ok(v):
                    return v
    return None


def probe_sizes(
    dims: Sequence[DynamicDim], example_sizes: dict[Key, int], budget: int = DEFAULT_BUDGET
) -> list[Point]:
    """Sizes to run, one symbol at a time: its minimum, an odd value in between and its maximum
    (or ``budget × max(example, 2)`` when the maximum is unbounded or larger); then, with more
    than one symbol, every dim at its minimum together. Dims that share a symbol get their
    sizes from the same symbol value; dims not listed in a point stay at their example size."""
    groups, _loose = _groups(dims, example_sizes, budget)
    points: list[Point] = []
    for g in groups:
        mid = _middle(g.lo, g.top, g.example)
        for v in dict.fromkeys(x for x in (g.lo, mid, g.top) if x is not None):
            points.append(g.point(v))
    if len(groups) > 1:
        points.append({k: s for g in groups for k, s in g.point(g.lo).items()})
    return points


def shapes_of(inputs: dict[str, Any]) -> Shapes:
    """The shapes of ``inputs`` (their tensors), as ``known`` verdicts are keyed."""
    return tuple(sorted((k, tuple(v.shape)) for k, v in inputs.items() if hasattr(v, "shape")))


def _shapes_at(shapes0: dict[str, tuple[int, ...]], point: Point) -> Shapes:
    """``shapes_of(resize(example, point))`` without making the inputs."""
    shapes = dict(shapes0)
    for (name, axis), size in point.items():
        if name in shapes and axis < len(shapes[name]):
            shape = list(shapes[name])
            shape[axis] = size
            shapes[name] = tuple(shape)
    return tuple(sorted(shapes.items()))


def resize(inputs: dict[str, Any], sizes: Point) -> dict[str, Any]:
    """``inputs`` with the given dims at the given sizes: repeated along the axis (or cut), as
    ``inputs.resize_batch`` does for dim 0. Non-tensor values come back unchanged."""
    import torch

    out = dict(inputs)
    for (name, axis), size in sizes.items():
        t = out.get(name)
        if not isinstance(t, torch.Tensor) or axis >= t.dim() or t.shape[axis] == size:
            continue
        n = t.shape[axis]
        if n == 0:  # nothing to repeat: zeros of the new size
            shape = list(t.shape)
            shape[axis] = size
            out[name] = t.new_zeros(shape)
            continue
        reps = -(-size // n)
        out[name] = torch.cat([t] * reps, dim=axis).narrow(axis, 0, size).contiguous()
    return out


# --- the program's own shape guards ---------------------------------------------------------

_SOURCE = re.compile(r"L\['(\w+)'\]\.size\(\)\[(\d+)\]")


class _Sized:
    """Stands in for a tensor in guard code: ``L['x'].size()[2]``."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def size(self) -> tuple[int, ...]:
        return self.shape


@dataclass
class GuardSet:
    """The program's shape guards as Python expressions over input shapes. Called with shapes,
    it gives the first guard they break, in torch's words, or None when all hold."""

    guards: list[tuple[str, Any, frozenset[Key]]]  # (text, code, dims it reads)
    _scope: dict[str, Any] = field(default_factory=dict, repr=False)

    def __call__(
        self,
        shapes: dict[str, tuple[int, ...]],
        only: frozenset[Key] | None = None,
        touching: frozenset[Key] | None = None,
    ) -> str | None:
        """``only``: judge just the guards that read nothing else; ``touching``: just those that
        read one of these (the others do not change when only these dims do)."""
        if not self._scope:
            from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

            self._scope.update({**SYMPY_INTERP, "math": math, "inf": math.inf})
        sources = {name: _Sized(shape) for name, shape in shapes.items()}
        for text, code, reads in self.guards:
            if (only is not None and not reads <= only) or (
                touching is not None and not reads & touching
            ):
                continue
            try:
                held = eval(code, self._scope, {"L": sources})  # torch's generated guard code
            except Exception:  # a guard over something this stand-in lacks: not judged here
                continue
            if not held:
                return "Guard failed: " + _SOURCE.sub(r"\1.size()[\2]", text)
        return None

    def ties(self, own: frozenset[Key], dynamic: frozenset[Key]) -> list[Key]:
        """Dynamic dims outside ``own`` that an equality guard relates to ``own``'s."""
        out: dict[Key, None] = {}
        for text, _code, reads in self.guards:
            if "==" in text and reads & own:
                out.update(dict.fromkeys(sorted(reads & dynamic - own)))
        return list(out)


def shape_guards(ep: Any) -> GuardSet | None:
    """The guards torch checks when the program is called (private ``_guards_code``, kept by
    ``torch.export.save``), or None when this torch has none to read."""
    codes = getattr(ep, "_guards_code", None)
    if not codes:
        return None
    guards = []
    for text in codes:
        try:
            code = compile(text, "<guard>", "eval")
        except SyntaxError:
            continue
        reads = frozenset((n, int(a)) for n, a in _SOURCE.findall(text))
        guards.append((text, code, reads))
    return GuardSet(guards) if guards else None


# --- checking ------------------------------------------------------------------------------


@dataclass
class SizeFailure(Report):
    size: int
    detail: str
    ran: bool = True  # False: rejected by the program's guards, read without running


@dataclass
class DimRange(Report):
    """What holds for one dynamic dim: the guaranteed range, or the part of it that runs."""

    dim: DynamicDim
    status: str  # "holds" | "narrowed" | "fails" | "not_checked"
    low: int | None = None  # the range that holds (both ends ran and agreed) …
    high: int | None = None  # … None: unbounded (torch's guarantee, checked up to `checked_high`)
    modulus: int = 1  # … in steps of `modulus` (from the expression or the guards)
    remainder: int = 0
    checked: list[int] = field(default_factory=list)  # sizes that ran and agreed
    failed: list[SizeFailure] = field(default_factory=list)
    checked_high: int | None = None  # the largest size that ran
    also: list[int] = field(default_factory=list)  # sizes below the guarantee that ran (1)
    text: str = ""
    # sizes at which the program ran and returned other outputs than the reference: a program
    # that accepts them must not be written as it is (its range narrowed, or refused)
    wrong: list[int] = field(default_factory=list)


@dataclass
class RangeReport(Report):
    status: str  # "pass" | "narrowed" | "fail" (no size of some dim ran)
    dims: list[DimRange] = field(default_factory=list)
    joint: str | None = None  # why every dim at its minimum together failed, if it did
    probes: int = 0  # points judged (each one run of the judge's)

    @property
    def texts(self) -> list[str]:
        return [r.text for r in self.dims]


@dataclass
class _State:
    """One group's findings, in symbol values."""

    group: _Group
    passed: set[int] = field(default_factory=set)
    failed: dict[int, str] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)  # by guards, not run
    scanned: list[int] = field(default_factory=list)
    step: int = 1  # the guards' step (2: every other value)
    ties: list[Key] = field(default_factory=list)  # other groups' dims a guard equates with
    one: bool | None = None  # size 1 below a guaranteed 2: ran (True), failed (False)
    one_detail: str = ""


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
    """
    sizes0 = example_sizes(dims, example)
    groups, loose = _groups(dims, sizes0, budget)
    shapes0 = {k: tuple(v.shape) for k, v in example.items() if hasattr(v, "shape")}
    states = [_State(g) for g in groups]
    probes = 0

    def run(points: list[Point]) -> list[str | None]:
        nonlocal probes
        shapes = [_shapes_at(shapes0, p) for p in points]
        todo = [p for p, at in zip(points, shapes, strict=True) if at not in (known or {})]
        probes += len(todo)
        verdicts: list[str | None] = []
        if todo:
            try:
                verdicts = _judged(judge, example, todo, range(len(todo)))
            except Exception:  # the judge itself raised: the reference fails at some point
                verdicts = [_alone(judge, example, todo, i) for i in range(len(todo))]
        fresh = iter(verdicts)
        return [(known or {})[at] if at in (known or {}) else next(fresh) for at in shapes]

    # first batch: min / middle / max of every group (on the guards' edges when known)
    at_one = {d.key for d in probed_at_one(dims)}
    batch: list[tuple[_State, int | str]] = []
    for st in states:
        if guards is not None:
            _scan(st, guards, shapes0, frozenset(d.key for d in dims))
        for v in _first_values(st):
            batch.append((st, v))
        if try_one and st.group.lo == 2 and all(d.key in at_one for d in st.group.dims):
            batch.append((st, "one"))
    _record(batch, run([_point(st, v) for st, v in batch]))
    for _ in range(rounds):
        batch = [(st, v) for st in states for v in _narrowing(st)]
        if not batch:
            break
        _record(batch, run([_point(st, v) for st, v in batch]))
    joint = None
    if len(states) > 1 and all(st.passed for st in states):
        (verdict,) = run(
            [{k: s for st in states for k, s in st.group.point(min(st.passed)).items()}]
        )
        if verdict is not None:
            joint = "every dynamic dim at its smallest size that ran, together: " + verdict
    results = [r for st in states for r in _results(st)]
    results += [DimRange(d, "not_checked", text=f"{describe(d)} (not checked)") for d in loose]
    statuses = {r.status for r in results}
    status = "fail" if "fails" in statuses else "pass"
    if status == "pass" and ("narrowed" in statuses or joint is not None):
        status = "narrowed"
    return RangeReport(status, results, joint, probes)


# the statuses of a size where the program ran and its outputs differ (parity.COMPARED's
# failures); a verdict (``_why``) starts with its status then
WRONG = ("fail_accuracy", "fail_shape")


def answered_wrong(why: str | None) -> bool:
    """Whether a probe's verdict says the program ran and returned other outputs."""
    return why is not None and why.startswith(WRONG)


def probed_at_one(dims: Sequence[DynamicDim]) -> list[DynamicDim]:
    """The dims also run at size 1: plain dims (size = symbol) whose symbol starts at 2, torch's
    floor for a dynamic dim, with no derived dim on the same symbol. torch lets sizes 0 and 1
    through that floor at run time, so what a program does there is checked, not assumed."""
    derived = {d.symbol for d in dims if (d.scale, d.offset) != (1, 0)}
    return [
        d
        for d in dims
        if d.symbol is not None
        and d.symbol not in derived
        and (d.scale, d.offset) == (1, 0)
        and d.symbol_min == 2
    ]


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


def verdict(size: Any) -> str | None:
    """A judged size (a ``parity.SizeResult``) as ``known`` holds it: None for a pass."""
    return None if size.status == "pass" else _why(size)


def _why(size: Any) -> str:
    """One line: "Guard failed: …" for a size the program refused, else "status: detail"."""
    detail = " ".join(str(getattr(size, "detail", "")).split())
    if size.status == "fail_to_run":
        return detail.removeprefix("AssertionError: ") if "Guard failed" in detail else detail
    return f"{size.status}: {detail}".strip(": ")


def _alone(judge: Judge, example: dict[str, Any], points: list[Point], i: int) -> str | None:
    try:
        return _judged(judge, example, points, range(i, i + 1))[0]
    except Exception as exc:  # compare lets the reference's own errors through
        text = (str(exc).splitlines() or [""])[0]  # ModelRaisedError: "the reference model …"
        if not text.startswith("the reference"):
            text = f"the reference fails here too: {type(exc).__name__}: {text}"
        return text[:300]


def _point(st: _State, v: int | str) -> Point:
    return st.group.point(1) if v == "one" else st.group.point(int(v))


def _record(batch: list[tuple[_State, int | str]], verdicts: list[str | None]) -> None:
    for (st, v), verdict in zip(batch, verdicts, strict=True):
        if v == "one":
            st.one, st.one_detail = verdict is None, verdict or ""
        elif verdict is None:
            st.passed.add(int(v))
        else:
            st.failed[int(v)] = verdict


def _scan(
    st: _State, guards: GuardSet, shapes0: dict[str, tuple[int, ...]], dynamic: frozenset[Key]
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


def _first_values(st: _State) -> list[int]:
    g = st.group
    ok = (lambda v: v not in st.rejected) if st.rejected else (lambda v: True)
    values = [g.lo, g.top]
    admitted = [v for v in st.scanned if ok(v)]
    if st.rejected and admitted:  # the guards' edges too: run where they say it starts
        values += [admitted[0], admitted[-1]]
    mid = _middle(g.lo, g.top, g.example)
    if mid is not None:
        values.append(mid)
        if not ok(mid):  # the odd middle is rejected ("even only"): one the guards admit too
            alt = _middle(g.lo, g.top, g.example, ok)
            if alt is not None:
                values.append(alt)
    return list(dict.fromkeys(values))


def _narrowing(st: _State) -> list[int]:
    """Probes between a failing end and the nearest size that ran, while a gap is open."""
    if not st.passed:
        return []
    known_bad = {**st.rejected, **st.failed}
    lo_ok, hi_ok = min(st.passed), max(st.passed)
    below = [v for v in known_bad if v < lo_ok]
    above = [v for v in known_bad if v > hi_ok]
    out = _ladder(max(below), lo_ok, st) if below else []
    return out + (_ladder(min(above), hi_ok, st) if above else [])


def _ladder(bad: int, good: int, st: _State) -> list[int]:
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


def _results(st: _State) -> list[DimRange]:
    g = st.group
    out = []
    wrong_values = [v for v, why in sorted(st.failed.items()) if answered_wrong(why)]
    if st.one is False and answered_wrong(st.one_detail):
        wrong_values.insert(0, 1)
    for d in g.dims:
        ran = [SizeFailure(d.size_at(v), why) for v, why in sorted(st.failed.items())]
        also = [d.size_at(1)] if st.one else []
        wrong = [d.size_at(v) for v in wrong_values]
        tie = ""
        if st.ties:  # said where the dim does not hold: varied alone may break the tie
            tied = ", ".join(f"{n} dim {a}" for n, a in st.ties)
            tie = f" (a guard ties it to {tied}, which stayed at its example size)"
        tail = ""
        if st.one is not None:
            tail = "; also runs at 1" if st.one else f"; not at 1: {st.one_detail[:200]}"
        if not st.passed:
            unrun = [SizeFailure(d.size_at(v), w, False) for v, w in sorted(st.rejected.items())]
            unrun = [f for f in unrun if f.size not in {r.size for r in ran}]
            text = f"fails for {d.label} {span_words(d.min, d.max)}: " + _failures(ran, unrun)
            out.append(
                DimRange(d, "fails", failed=ran + unrun[:8], text=text + tie + tail, wrong=wrong)
            )
            continue
        lo_v, hi_v = min(st.passed), max(st.passed)
        step = st.step
        if any(lo_v < v < hi_v and (v - lo_v) % step == 0 for v in st.failed):
            step = 1  # failures inside that the guards' step does not explain
        # sizes the guards reject off the step are said by the step ("even sizes only")
        unrun = [
            SizeFailure(d.size_at(v), why, False)
            for v, why in sorted(st.rejected.items())
            if v not in st.failed and (v - lo_v) % step == 0
        ]
        whole = lo_v == g.lo and hi_v == g.top and not st.failed and not st.rejected
        modulus = d.modulus * step
        remainder = d.size_at(lo_v) % modulus if modulus > 1 else 0
        low = d.size_at(lo_v)
        high: int | None = d.size_at(hi_v)
        # the top ran (or the last size on the step below it): the upper end stays torch's
        top = hi_v == g.top or (
            g.top - hi_v < step and all((v - lo_v) % step for v in st.failed if v > hi_v)
        )
        if top:
            high = None if g.hi is None else d.size_at(g.hi)
        if whole:
            status, text = "holds", describe(d)
        else:
            status = "narrowed"
            text = "runs for " + range_words(d, low, high, modulus, remainder)
        if top and g.top != g.hi:  # the guaranteed top was not run (cost)
            text += f" (checked up to {d.size_at(hi_v)})"
        if not whole:
            text += "; fails at " + _failures(ran, unrun, low, d.size_at(hi_v)) + tie
        out.append(
            DimRange(
                d,
                status,
                low,
                high,
                modulus,
                remainder,
                sorted(d.size_at(v) for v in st.passed),
                ran + unrun[:8],
                d.size_at(hi_v),
                also,
                text + tail,
                wrong,
            )
        )
    return out


def _failures(
    ran: list[SizeFailure], unrun: list[SizeFailure], low: int | None = None, high: int = 0
) -> str:
    """ "12: Guard failed: …": the failing sizes nearest the range that runs (the largest one
    below ``low``, those inside, the smallest one above ``high``: the edges of what is known),
    how many more, and the reason of the first one listed (one that ran, when one did)."""
    every = {f.size: f for f in unrun} | {f.size: f for f in ran}  # a run's reason wins
    sizes = sorted(every)
    if low is None:  # nothing ran: the first few
        listed = sizes[:4]
    else:
        below = [v for v in sizes if v < low]
        inside = [v for v in sizes if low < v < high][:3]
        above = [v for v in sizes if v > high]
        listed = below[-1:] + inside + above[:1]
    more = len(sizes) - len(listed)
    text = ", ".join(str(v) for v in listed) + (f" (and {more} more)" if more > 0 else "")
    first = next((every[v] for v in listed if every[v].ran), every[listed[0]]) if listed else None
    return f"{text}: {first.detail[:240]}" if first is not None else text


def check_program(
    ep: Any,
    example: dict[str, Any],
    judge: Judge,
    rename: dict[str, str] | None = None,
    budget: int = DEFAULT_BUDGET,
    known: dict[Shapes, str | None] | None = None,
) -> RangeReport:
    """Every dynamic dim of ``ep`` checked on ``example`` (named as the caller names its inputs:
    ``rename`` maps the program's input names to those), dims the model takes together moved
    together, the program's own guards placing the probes."""
    import dataclasses

    dims = dynamic_dims(ep)
    if rename:
        dims = [dataclasses.replace(d, input=rename.get(d.input, d.input)) for d in dims]
    dims = tie_alike(dims, example_sizes(dims, example))
    guards = shape_guards(ep) if not rename else None
    return check_ranges(dims, example, judge, budget=budget, guards=guards, known=known)


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
