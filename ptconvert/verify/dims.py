"""A program's dynamic dims as its ExportedProgram declares them (``dynamic_dims``: each user
input's symbolic axes, their ranges and the symbol they share), or as a program without one
was asked for (``DeclaredDims``: a trace exported to ONNX with named axes), and in words
(``describe``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ptconvert.report import Report

Key = tuple[str, int]  # (input name, axis)
Point = dict[Key, int]  # sizes to set: (input, axis) → size
Shapes = tuple[tuple[str, tuple[int, ...]], ...]  # every tensor input's shape, by name
# judge(make_inputs, keys) → a ParityReport-like object: ``.sizes`` with ``.status``/``.detail``
# per key (``functools.partial(parity.compare, reference, candidate)`` is one)
Judge = Callable[[Callable[[int], dict[str, Any]], list[int]], Any]


@dataclass(frozen=True)
class DynamicDim(Report):
    """One symbolic dim of a user input: ``size = scale * symbol + offset`` within [min, max]."""

    input: str
    axis: int
    expr: str  # torch's expression ("s53", "2*s27 + 1"), for machines only
    symbol: str | None  # its single free symbol; None when it has several
    min: int  # the size range torch guarantees for this dim
    max: int | None  # None: unbounded
    scale: int = 1  # 0 when the expression is not affine in one symbol
    offset: int = 0
    symbol_min: int = 0  # the symbol's own range
    symbol_max: int | None = None
    shared: tuple[Key, ...] = ()  # other user-input dims that use the same symbol
    rank: int = 0
    integer: bool = False  # an integer tensor (token ids)

    @property
    def key(self) -> Key:
        return (self.input, self.axis)

    @property
    def where(self) -> str:
        return f"{self.input} dim {self.axis}"

    @property
    def modulus(self) -> int:
        """Sizes step by this much (2 with ``2*s + 1``: odd sizes only)."""
        return abs(self.scale) if self.scale else 1

    @property
    def remainder(self) -> int:
        return self.offset % self.modulus

    @property
    def label(self) -> str:
        """What the dim most likely is, from its place (NCHW, NCDHW, token ids)."""
        if self.axis == 0:
            return "batch"
        spatial = {4: {2: "height", 3: "width"}, 5: {2: "depth", 3: "height", 4: "width"}}
        if self.rank in spatial:
            return spatial[self.rank].get(self.axis, "any size")
        if (self.rank == 2 and self.axis == 1 and self.integer) or self.rank == 3:
            return "sequence length" if self.integer else "length"
        return "any size"

    def size_at(self, value: int) -> int:
        return self.scale * value + self.offset

    def value_of(self, size: int) -> int | None:
        """The symbol value that gives ``size``, if one does."""
        if not self.scale or (size - self.offset) % self.scale:
            return None
        return (size - self.offset) // self.scale


def _bound(value: Any) -> int | None:
    """A finite sympy bound as an int; None for torch's ``int_oo`` or sympy's ``oo``."""
    if "oo" in str(value):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _affine(expr: Any, symbol: Any) -> tuple[int, int] | None:
    """(scale, offset) when ``expr == scale*symbol + offset`` with integers, else None."""
    import sympy

    try:
        expanded = sympy.expand(expr)
        scale, offset = expanded.coeff(symbol, 1), expanded.subs(symbol, 0)
        if not (scale.is_Integer and offset.is_Integer):
            return None
        if sympy.simplify(expanded - (scale * symbol + offset)) != 0:
            return None
    except Exception:  # torch's own sympy functions (FloorDiv …): not affine for us
        return None
    return int(scale), int(offset)


def user_inputs(ep: Any) -> list[tuple[str, Any]]:
    """(name, placeholder value) of every user input, named as forward's parameters are."""
    specs = [s for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    signature = ep.module_call_graph[0].signature if ep.module_call_graph else None
    names = list(getattr(signature, "forward_arg_names", None) or [])
    if len(names) != len(specs):  # placeholder names then (TS2EP's x_1 and the like)
        names = [s.arg.name for s in specs]
    out = []
    for name, spec in zip(names, specs, strict=True):
        node = placeholders.get(spec.arg.name)
        out.append((name, node.meta.get("val") if node is not None else None))
    return out


@dataclass(frozen=True)
class DeclaredDims:
    """The dynamic dims a program was written with where no ExportedProgram states them (ONNX
    from TorchScript's exporter, whose ``dynamic_axes`` name them): the check probes them as it
    probes an ExportedProgram's; there are no guards to read."""

    dims: tuple[DynamicDim, ...]


def dynamic_dims(ep: Any) -> list[DynamicDim]:
    """Every symbolic dim of the program's user inputs, with the range torch guarantees (a
    ``DeclaredDims``: those declared)."""
    if isinstance(ep, DeclaredDims):
        return list(ep.dims)
    found: list[tuple[str, int, Any, int, bool]] = []
    for name, val in user_inputs(ep):
        shape = getattr(val, "shape", None)
        if shape is None:
            continue
        integer = not (val.dtype.is_floating_point or val.dtype.is_complex)
        for axis, size in enumerate(shape):
            expr = getattr(getattr(size, "node", None), "expr", None)
            if expr is not None and expr.free_symbols:
                found.append((name, axis, expr, len(shape), integer))
    ranges = ep.range_constraints
    by_symbol: dict[Any, list[Key]] = {}
    for name, axis, expr, _rank, _int in found:
        for sym in expr.free_symbols:
            by_symbol.setdefault(sym, []).append((name, axis))
    dims = []
    for name, axis, expr, rank, integer in found:
        symbols = sorted(expr.free_symbols, key=str)
        sym = symbols[0] if len(symbols) == 1 else None
        line = _affine(expr, sym) if sym is not None else None
        scale, offset = line or (0, 0)
        sym_range = ranges.get(sym) if sym is not None else None
        sym_lo = _bound(sym_range.lower) if sym_range is not None else None
        sym_hi = _bound(sym_range.upper) if sym_range is not None else None
        own = ranges.get(expr)
        if own is not None:  # torch states a derived dim's range too ("2*s27 - 1: VR[3, …]")
            lo, hi = _bound(own.lower), _bound(own.upper)
        elif scale > 0 and sym_lo is not None:
            lo, hi = scale * sym_lo + offset, None if sym_hi is None else scale * sym_hi + offset
        else:
            lo, hi = None, None
        if sym_lo is None and scale > 0 and lo is not None:  # the symbol from the dim's range
            sym_lo = -(-(lo - offset) // scale)
            sym_hi = None if hi is None else (hi - offset) // scale
        shared = tuple(k for s in symbols for k in by_symbol[s] if k != (name, axis))
        dims.append(
            DynamicDim(
                name,
                axis,
                str(expr),
                str(sym) if sym is not None else None,
                lo if lo is not None else 0,
                hi,
                scale,
                offset,
                sym_lo if sym_lo is not None else 0,
                sym_hi,
                tuple(dict.fromkeys(shared)),
                rank,
                integer,
            )
        )
    return dims


def span_words(lo: int, hi: int | None) -> str:
    if hi is None:
        return f"{lo} or more"
    return f"{lo} only" if lo == hi else f"{lo}–{hi}"


def _step(modulus: int, remainder: int) -> str:
    if modulus <= 1:
        return ""
    if modulus == 2:
        return ", odd sizes only" if remainder else ", even sizes only"
    if remainder == 0:
        return f", multiples of {modulus} only"
    return f", sizes of the form {modulus}k+{remainder} only"


def range_words(dim: DynamicDim, lo: int, hi: int | None, modulus: int, remainder: int) -> str:
    return f"{dim.label} {span_words(lo, hi)}{_step(modulus, remainder)}"


def describe(dim: DynamicDim, dims: Sequence[DynamicDim] = ()) -> str:
    """The guaranteed range in words: "batch 2 or more", "height 13–2048, odd sizes only".

    With ``dims`` (all of the program's), a derived dim also says what it is tied to."""
    text = range_words(dim, dim.min, dim.max, dim.modulus, dim.remainder)
    if dim.scale not in (0, 1) or dim.offset:
        base = next(
            (d for d in dims if d.key in dim.shared and (d.scale, d.offset) == (1, 0)), None
        )
        if base is not None:
            sign = "+" if dim.offset >= 0 else "-"
            text += f" (always {dim.scale} × {base.where} {sign} {abs(dim.offset)})".replace(
                " + 0)", ")"
            )
    return text
