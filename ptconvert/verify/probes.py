"""Where a dynamic dim of a program is probed: the sizes worth running, and inputs made at them.

Probe points vary one symbol at a time (dims that share a symbol, or are derived from it, move
together; every other dim stays at its example size): the minimum, an odd value in between and
the maximum. A maximum that is unbounded, or more than ``budget`` × the example size, is
replaced by ``budget × max(example, 2)`` (default budget 16): the probe then costs at most
about ``budget`` times the example in work and memory for a model linear in that dim, and the
report says the guaranteed maximum was not run. Last, every dim at the smallest size that ran
for it is run together (probe_sizes lists every dim at its minimum).

The points only: running them and judging what they give is ``ranges.py``'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ptconvert.verify.dims import DynamicDim

Key = tuple[str, int]  # (input name, axis)
Point = dict[Key, int]  # sizes to set: (input, axis) → size
Shapes = tuple[tuple[str, tuple[int, ...]], ...]  # every tensor input's shape, by name

DEFAULT_BUDGET = 16


@dataclass
class Group:
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


def groups_of(
    dims: Sequence[DynamicDim], example: dict[Key, int], budget: int
) -> tuple[list[Group], list[DynamicDim]]:
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
        groups.append(Group(symbol, members, lo, hi, at, max(top, lo)))
    return groups, loose


def middle(lo: int, hi: int, avoid: int, ok: Callable[[int], bool] = lambda v: True) -> int | None:
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
    groups, _loose = groups_of(dims, example_sizes, budget)
    points: list[Point] = []
    for g in groups:
        mid = middle(g.lo, g.top, g.example)
        for v in dict.fromkeys(x for x in (g.lo, mid, g.top) if x is not None):
            points.append(g.point(v))
    if len(groups) > 1:
        points.append({k: s for g in groups for k, s in g.point(g.lo).items()})
    return points


def shapes_of(inputs: dict[str, Any]) -> Shapes:
    """The shapes of ``inputs`` (their tensors), as ``known`` verdicts are keyed."""
    return tuple(sorted((k, tuple(v.shape)) for k, v in inputs.items() if hasattr(v, "shape")))


def shapes_at(shapes0: dict[str, tuple[int, ...]], point: Point) -> Shapes:
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
