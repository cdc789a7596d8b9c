"""What probing a program's dynamic dims found, and the report that says it in words.

A probe's verdict (None: it passed; else the judge's status and detail, one line), each group's
findings in symbol values (:class:`GroupFindings`), and per dim the range that holds, the sizes
that failed nearest it, and the sizes where the program ran but returned other outputs
(``wrong``): :class:`DimRange`, gathered in a :class:`RangeReport`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ptconvert.report import Report
from ptconvert.verify.dims import DynamicDim, describe, range_words, span_words
from ptconvert.verify.probes import Group, Key


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
    # size 1, below torch's guaranteed 2, run and refused: why (a guard, an error); "" otherwise
    not_at_one: str = ""


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
class GroupFindings:
    """One group's findings, in symbol values."""

    group: Group
    passed: set[int] = field(default_factory=set)
    failed: dict[int, str] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)  # by guards, not run
    scanned: list[int] = field(default_factory=list)
    step: int = 1  # the guards' step (2: every other value)
    ties: list[Key] = field(default_factory=list)  # other groups' dims a guard equates with
    one: bool | None = None  # size 1 below a guaranteed 2: ran (True), failed (False)
    one_detail: str = ""


# the statuses of a size where the program ran and its outputs differ (parity.COMPARED's
# failures); a verdict (``_why``) starts with its status then
WRONG = ("fail_accuracy", "fail_shape")


def answered_wrong(why: str | None) -> bool:
    """Whether a probe's verdict says the program ran and returned other outputs."""
    return why is not None and why.startswith(WRONG)


def verdict(size: Any) -> str | None:
    """A judged size (a ``parity.SizeResult``) as ``known`` holds it: None for a pass."""
    return None if size.status == "pass" else _why(size)


def _why(size: Any) -> str:
    """One line: "Guard failed: …" for a size the program refused, else "status: detail"."""
    detail = " ".join(str(getattr(size, "detail", "")).split())
    if size.status == "fail_to_run":
        return detail.removeprefix("AssertionError: ") if "Guard failed" in detail else detail
    return f"{size.status}: {detail}".strip(": ")


def dim_results(st: GroupFindings) -> list[DimRange]:
    """Each dim of the group: the range that holds (or none), in words, and what failed."""
    g = st.group
    out = []
    wrong_values = [v for v, why in sorted(st.failed.items()) if answered_wrong(why)]
    if st.one is False and answered_wrong(st.one_detail):
        wrong_values.insert(0, 1)
    for d in g.dims:
        ran = [SizeFailure(d.size_at(v), why) for v, why in sorted(st.failed.items())]
        also = [d.size_at(1)] if st.one else []
        refused_one = (st.one_detail or "refused") if st.one is False else ""
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
                DimRange(
                    d,
                    "fails",
                    failed=ran + unrun[:8],
                    text=text + tie + tail,
                    wrong=wrong,
                    not_at_one=refused_one,
                )
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
                refused_one,
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
