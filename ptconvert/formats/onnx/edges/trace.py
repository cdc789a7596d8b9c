"""The module → onnx edge through torch.onnx's TorchScript exporter (``--onnx-exporter
torchscript``), the exporter optimum-cli runs.

It traces the module once at the example (batch 2 at least with ``--dynamic-batch``: a trace at
batch 1 may fold a size-1 dim away) and writes the graph with ``dynamic_axes`` named as optimum
names them (``batch_size``, ``sequence_length``, ``height``/``width``, ``<input>_<axis>``
otherwise), the dims the dynamo route makes dynamic. No ``torch.export`` and no second trace:
a tiny model's export takes a tenth of a second where the dynamo exporter takes seconds.

What a trace costs: Python control flow and Python numbers computed from sizes are frozen at
the example's values (TorchScript's TracerWarning says where). The check therefore gets the
dims declared here (``verify.dims.DeclaredDims``) and probes each at its ends and at sizes
between, as it probes an ExportedProgram's; a program that computes something else at a size is
refused, never written. Chosen explicitly, never as a fallback: a route to ONNX uses the dynamo
exporter unless this one is asked for.

Not here (each refused, named): ``--quantize``, ``--onnx-optimize``, ``--external-data`` or
weights over protobuf's 2 GB, inputs that are not tensors, generation tasks with past.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from typing import Any

from ptconvert.convert.state import RunState
from ptconvert.convert.steps import require_inputs
from ptconvert.deps import require
from ptconvert.errors import UnsupportedConversionError, UsageError
from ptconvert.formats.onnx.edges.export import (
    PROTOBUF_LIMIT,
    check_written,
    stage_output,
)
from ptconvert.formats.onnx.options import OnnxOptions
from ptconvert.options import Options
from ptconvert.quiet import quiet_torch
from ptconvert.verify.dims import DeclaredDims, DynamicDim

_NOT_WITH = {  # options the TorchScript exporter's edge does not carry out
    "quantize": "--quantize",
    "onnx_optimize": "--onnx-optimize",
    "external_data": "--external-data",
}


def _refuse_options(opts: Options) -> None:
    own = opts.of(OnnxOptions)
    asked = [f for name, f in _NOT_WITH.items() if getattr(opts, name, getattr(own, name, None))]
    if asked:
        raise UsageError(
            f"{', '.join(asked)} is not available with --onnx-exporter torchscript",
            hint="use the dynamo exporter (--onnx-exporter dynamo, the default)",
        )


def declared_dims(
    opts: Options, sample: dict[str, Any], state: RunState, axes: list[Any]
) -> list[DynamicDim]:
    """The dims the dynamo route would make dynamic (``exporting.dynamic_shapes``: the batch,
    a transformers family's axes, ``--dynamic``, the bounds the check found), each named as
    the ONNX file names it and with the range asked for."""
    from ptconvert.convert.exporting import dynamic_shapes
    from ptconvert.model.axes import AXIS_NAMES

    shapes = dynamic_shapes(opts, sample, state.bounds, axes) or {}
    found: list[tuple[str, int, str, int, int | None]] = []
    for name, spec in shapes.items():
        for axis, hint in (spec or {}).items():
            low = getattr(hint, "min", None)
            high = getattr(hint, "max", None)
            batch = axis == 0 and opts.dynamic_batch
            label = "batch_size" if batch else AXIS_NAMES.get((name, axis), f"{name}_{axis}")
            if label not in ("batch_size", *AXIS_NAMES.values()):
                label = f"{name}_{axis}"
            high = None if high is None or high >= 2**31 else int(high)
            found.append((name, axis, label, max(1, int(low or 1)), high))
    dims = []
    for name, axis, label, low, high in found:
        shared = tuple((n, a) for n, a, lb, _, _ in found if lb == label and (n, a) != (name, axis))
        tensor = sample[name]
        integer = not (tensor.dtype.is_floating_point or tensor.dtype.is_complex)
        dims.append(
            DynamicDim(
                name,
                axis,
                expr=label,
                symbol=label,
                min=low,
                max=high,
                symbol_min=low,
                symbol_max=high,
                shared=shared,
                rank=tensor.dim(),
                integer=integer,
            )
        )
    return dims


def _output_axes(
    outputs: dict[str, Any], dims: list[DynamicDim], sample: dict[str, Any]
) -> dict[str, dict[int, str]]:
    """Each output's dims that have a dynamic input dim's size at the trace, named as it is
    (when that size belongs to one name only): ``last_hidden_state`` gets ``batch_size`` and
    ``sequence_length`` as optimum names them; a dim left out gets the exporter's own name."""
    by_size: dict[int, set[str]] = {}
    for d in dims:
        by_size.setdefault(sample[d.input].shape[d.axis], set()).add(str(d.symbol))
    out: dict[str, dict[int, str]] = {}
    for name, tensor in outputs.items():
        axes = {
            i: next(iter(by_size[s]))
            for i, s in enumerate(tensor.shape)
            if len(by_size.get(s, ())) == 1
        }
        if axes:
            out[name] = axes
    return out


def trace_export(state: RunState, opts: Options) -> None:
    require("onnx")
    _refuse_options(opts)
    import torch

    from ptconvert.convert.exporting import family_axes
    from ptconvert.model.wrappers import leaf_name, leaf_tuple, output_leaves

    inputs = require_inputs(state)
    module = state.module
    batch = max(inputs.batch, 2) if opts.dynamic_batch else inputs.batch
    sample = inputs.at(batch)
    others = [n for n, v in sample.items() if not isinstance(v, torch.Tensor)]
    if others:
        raise UnsupportedConversionError(
            f"TorchScript's ONNX exporter takes tensor inputs only; {', '.join(others)} is not one",
            path=state.src,
            hint="use the dynamo exporter (--onnx-exporter dynamo, the default)",
        )
    size = sum(t.numel() * t.element_size() for t in module.state_dict().values())
    if size > PROTOBUF_LIMIT:
        raise UnsupportedConversionError(
            f"the weights are {size / 1024**3:.1f} GB, over what one protobuf holds, and "
            "TorchScript's exporter is used here without external data",
            path=state.src,
            hint="use the dynamo exporter (--onnx-exporter dynamo, the default), which writes "
            "external data",
        )
    hf = hasattr(module, "config")
    axes = family_axes(module, opts, sample) if hf and not state.static_axes else []
    dims = declared_dims(opts, sample, state, axes)
    names = list(sample)
    traced = leaf_tuple(module, names).eval()
    with torch.no_grad():
        leaves = output_leaves(module(**sample))
    outputs = {leaf_name(k): v for k, v in leaves.items()}
    if len(outputs) != len(leaves) or set(outputs) & set(names):
        outputs = {f"output_{i}": v for i, v in enumerate(leaves.values())}
    dynamic_axes: dict[str, dict[int, str]] = {}
    for d in dims:
        dynamic_axes.setdefault(d.input, {})[d.axis] = str(d.symbol)
    dynamic_axes.update(_output_axes(outputs, dims, sample))
    own = opts.of(OnnxOptions)
    staged = stage_output(state, external=False)
    quiet = io.StringIO()
    with (
        quiet_torch(),
        contextlib.redirect_stdout(quiet),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always", torch.jit.TracerWarning)
        try:
            torch.onnx.export(
                traced,
                tuple(sample[n] for n in names),
                str(staged),
                input_names=names,
                output_names=list(outputs),
                dynamic_axes=dynamic_axes,
                opset_version=own.opset,
                dynamo=False,
            )
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            raise UnsupportedConversionError(
                f"TorchScript's ONNX exporter cannot export this model: {type(exc).__name__}: "
                f"{first}",
                path=state.src,
                hint="use the dynamo exporter (--onnx-exporter dynamo, the default)",
            ) from None
    check_written(state)
    state.declared = DeclaredDims(tuple(dims))
    from ptconvert.verify.dims import describe

    state.dynamic_range = {d.where: describe(d, dims) for d in dims}
    state.family_axes = list(axes)
    frozen = sum(issubclass(w.category, torch.jit.TracerWarning) for w in caught)
    opset = _opset(staged)
    state.notes.append(
        f"ONNX opset {opset} from TorchScript's exporter (--onnx-exporter torchscript): a trace "
        f"at batch {batch}"
        + (
            f"; the tracer warned {frozen} time{'s' * (frozen != 1)} that a Python value is "
            "frozen at the example's (the check compares other sizes)"
            if frozen
            else ""
        )
        + (
            "; dynamic dims named "
            + ", ".join(dict.fromkeys(f"{d.symbol} (dim {d.axis})" for d in dims))
            if dims
            else ""
        )
    )
    if own.opset is not None and opset != own.opset:
        state.notes.append(f"--opset {own.opset} was asked for; the exporter wrote opset {opset}")


def _opset(path: Any) -> int | None:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
