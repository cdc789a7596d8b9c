"""The exported → pte edge: ExecuTorch's lowering of the ExportedProgram into a ``.pte``.

``to_edge_transform_and_lower`` with XNNPACK's partitioner (``--pte-backend xnnpack``, the
default: the ops XNNPACK takes run in its delegate, the rest on ExecuTorch's portable kernels)
or none (``--pte-backend portable``: every op on the portable kernels), then ``to_executorch``
and the program written as the file.

ExecuTorch plans memory for the largest size of every dynamic dim: a dim without an upper
bound would be planned at the example's size, and the runtime would refuse anything larger.
So before lowering, every dynamic dim gets one (``upper_bounds``): the batch (dims 0 that share
a symbol with no other axis) up to ``MAX_BATCH`` (or the largest ``--batch-sizes``), any other
dim (a transformers model's sequence, an image's height and width) up to the smaller of its own
limit and ``MAX_SIZE`` (at least the example's size); a bound the user gave (``--dynamic
NAME:AXIS:MIN:MAX``) or verification found (``state.bounds``) is kept. The program is exported
again from the exported program's own module with those bounds (torch.export: only its graph
is traced, not the model), and that program is what the check's probes read.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

from ptconvert import _compat
from ptconvert.convert.state import RunState
from ptconvert.deps import require
from ptconvert.errors import UnsupportedConversionError, named_error
from ptconvert.formats.pte.options import PteOptions
from ptconvert.options import DYNAMIC_SPEC, ExportMode, Options
from ptconvert.quiet import quiet_torch

MAX_BATCH = 8  # the batch's upper bound in a .pte (or the largest --batch-sizes)
MAX_SIZE = 512  # any other dynamic dim's, where its own limit is larger or none

Key = tuple[str, int]


def pte_export(state: RunState, opts: Options) -> None:
    with quiet_torch():  # importing it loads torchao, which prints what it cannot load
        require("executorch.exir")
    assert state.exported is not None and state.output is not None
    bounds = upper_bounds(state, opts)
    if bounds:
        _export_bounded(state, bounds, opts.strict)
    started = time.perf_counter()
    program = lower(state.exported, opts.of(PteOptions).pte_backend, src=state.src)
    try:
        with open(state.output, "wb") as fh:
            program.write_to_file(fh)
    except OSError as exc:  # the filesystem (no space, read-only …): said as such, exit 9
        raise named_error(exc, state.destination or state.output) or exc from None
    state.notes.append(_lowered(state, opts, time.perf_counter() - started))


def upper_bounds(state: RunState, opts: Options) -> dict[Any, tuple[int, int]]:
    """The (min, max) each dynamic dim's symbol gets in the .pte, for the symbols whose range
    changes (none: the program is lowered as it is)."""
    from ptconvert.verify.dims import dynamic_dims

    ep = state.exported
    dims = [d for d in dynamic_dims(ep) if d.symbol is not None and (d.scale, d.offset) == (1, 0)]
    if not dims:
        return {}
    given = {
        (m["name"], int(m["axis"]))
        for m in map(DYNAMIC_SPEC.match, opts.dynamic)
        if m is not None and m["max"]
    } | set(state.bounds)
    example = _example_sizes(ep)
    batch_cap = max([MAX_BATCH, *(opts.batch_sizes or [])])
    by_symbol: dict[str, list[Any]] = {}
    for d in dims:
        by_symbol.setdefault(str(d.symbol), []).append(d)
    changed: dict[Any, tuple[int, int]] = {}
    for symbol, group in by_symbol.items():
        d = group[0]
        low, high = d.symbol_min, d.symbol_max
        if any(g.key in given for g in group) and high is not None:
            continue  # the user's bound, or verification's
        batch = all(g.axis == 0 for g in group)
        seen = max(example.get(g.key, 1) for g in group)
        cap = batch_cap if batch else max(MAX_SIZE, seen)
        top = cap if high is None else min(high, cap)
        if top != high:
            changed[symbol] = (low if low > 2 else 1, max(top, seen))
    return changed


def _example_sizes(ep: Any) -> dict[Key, int]:
    from ptconvert.verify.dims import user_inputs

    args, kwargs = ep.example_inputs or ((), {})
    leaves = _compat.torch_api.pytree().tree_leaves((args, kwargs))
    names = [n for n, _ in user_inputs(ep)]
    if len(leaves) != len(names):
        return {}
    return {
        (n, axis): int(size)
        for n, leaf in zip(names, leaves, strict=True)
        for axis, size in enumerate(getattr(leaf, "shape", ()))
    }


def _export_bounded(state: RunState, bounds: dict[Any, tuple[int, int]], mode: ExportMode) -> None:
    """``state.exported`` exported again from its own module with every dynamic dim bounded
    (those of ``bounds`` changed, the others as they were), in ``mode`` (``--export-mode``)."""
    from torch.export import Dim

    from ptconvert.convert.exporting import dynamic_range_words, export_in_mode
    from ptconvert.verify.dims import dynamic_dims, user_inputs

    ep = state.exported
    if not ep.example_inputs:
        raise UnsupportedConversionError(
            "ExecuTorch needs an upper bound for every dynamic dim, and this program carries no "
            "example inputs to export it again with bounds",
            path=state.src,
            hint="convert from the model (--model, or a Hugging Face directory), or without "
            "--dynamic-batch",
        )
    args, kwargs = ep.example_inputs
    pytree = _compat.torch_api.pytree()
    leaves, spec = pytree.tree_flatten((args, kwargs))
    names = [n for n, _ in user_inputs(ep)]
    dims = dynamic_dims(ep)
    ranges: dict[str, tuple[int, int | None]] = {}
    for d in dims:
        if d.symbol is not None and (d.scale, d.offset) == (1, 0):
            ranges.setdefault(d.symbol, bounds.get(d.symbol) or (d.symbol_min, d.symbol_max))
    # one named Dim per symbol: dims that were one symbol stay one (a token batch shared)
    named = {
        s: Dim(f"d{i}", min=lo, max=hi) if hi is not None else Dim(f"d{i}", min=lo)
        for i, (s, (lo, hi)) in enumerate(ranges.items())
    }
    shapes: list[Any] = [None] * len(leaves)
    for d in dims:
        if d.input not in names or len(names) != len(leaves):
            raise UnsupportedConversionError(
                f"ExecuTorch needs an upper bound for every dynamic dim; {d.where} cannot be "
                "bounded in this program (its inputs are nested)",
                path=state.src,
                hint="bound the dims yourself: --dynamic NAME:AXIS:MIN:MAX",
            )
        i = names.index(d.input)
        shapes[i] = {**(shapes[i] or {}), d.axis: named.get(d.symbol or "", Dim.DYNAMIC)}
    shape_args, shape_kwargs = pytree.tree_unflatten(shapes, spec)
    module = ep.module()
    try:
        bound = inspect.signature(module.forward).bind(*shape_args, **shape_kwargs).arguments
        bounded = export_in_mode(module, args, kwargs, dict(bound), mode)
    except Exception as exc:  # torch raises many kinds here: the first line says which
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise UnsupportedConversionError(
            "ExecuTorch needs an upper bound for every dynamic dim, and the program does not "
            f"export again with them: {type(exc).__name__}: {first}",
            path=state.src,
            hint="bound the dims yourself: --dynamic NAME:AXIS:MIN:MAX",
        ) from None
    state.exported = bounded
    state.dynamic_range = dynamic_range_words(bounded)
    changed = [d for d in dynamic_dims(bounded) if d.max is not None]
    words = ", ".join(f"{d.where} up to {d.max}" for d in changed if _was(d, dims))
    state.notes.append(
        "ExecuTorch plans memory for the largest sizes, so every dynamic dim has an upper "
        f"bound in the .pte: {words} (defaults: batch {MAX_BATCH}, other dims {MAX_SIZE} or "
        "their own limit; --dynamic NAME:AXIS:MIN:MAX sets one, --batch-sizes raises the "
        "batch's); the runtime refuses larger sizes"
    )


def _was(new: Any, old: list[Any]) -> bool:
    """Whether the dim ``new`` had another upper bound before."""
    return any(o.key == new.key and o.max != new.max for o in old)


def lower(
    ep: Any,
    backend: str,
    *,
    src: Any = None,
    constant_methods: dict[str, Any] | None = None,
    mutable_buffers: list[str] | None = None,
    what: str = "this program",
) -> Any:
    """``ep`` lowered by ExecuTorch for ``backend`` (xnnpack: its partitioner, the rest on the
    portable kernels; portable: every op there), with ``constant_methods`` beside ``forward``
    and the initial values of the ``mutable_buffers`` named kept in the file (a static cache's
    zeros): the ExecutorchProgram to write."""
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower

    partitioner: list[Any] = []
    if backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
            XnnpackPartitioner,
        )

        partitioner = [XnnpackPartitioner()]
    passes: list[Any] = []
    if mutable_buffers:
        from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

        passes.append(InitializedMutableBufferPass(mutable_buffers))
    try:
        with quiet_torch():
            edge = to_edge_transform_and_lower(
                ep, partitioner=partitioner, constant_methods=constant_methods
            )
            return edge.to_executorch(ExecutorchBackendConfig(passes=passes))
    except Exception as exc:  # ExecuTorch's errors are long: the first line says what failed
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise UnsupportedConversionError(
            f"ExecuTorch cannot lower {what}: {type(exc).__name__}: {first}",
            path=src,
            hint="--pte-backend portable runs every op on the portable kernels"
            if backend == "xnnpack"
            else "an operator without a portable kernel fails here",
        ) from None


def _lowered(state: RunState, opts: Options, seconds: float) -> str:
    """What the written program runs where, read back from the file."""
    from ptconvert.formats.pte.flatbuffer import forward_of, read_program

    assert state.output is not None
    forward = forward_of(read_program(state.output))
    calls = ", ".join(f"{n} × {k}" for k, n in forward.delegates.items())
    ops = list(forward.portable_ops)  # the most called first
    left = ", ".join(ops[:8]) + (f" and {len(ops) - 8} more" if len(ops) > 8 else "") or "none"
    how = (
        f"XNNPACK delegate calls: {calls or 'none'}; ops left to the portable kernels: {left}"
        if opts.of(PteOptions).pte_backend == "xnnpack"
        else f"every op on ExecuTorch's portable kernels ({len(forward.portable_ops)} kinds)"
    )
    return f"ExecuTorch program lowered in {seconds:.1f} s: {how}"
