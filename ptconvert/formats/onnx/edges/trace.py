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


def refuse_length_dependent(model: Any, src: Any) -> None:
    """A transformers model whose rope frequencies change with the sequence's length (rope
    type ``dynamic``, ``longrope``: a branch on the length) is refused: the trace freezes the
    branch at the example's length, the graph takes any length, and beyond the config's
    positions (where the check does not reach) it computes something else."""
    from ptconvert.formats.rope_config import LENGTH_DEPENDENT, rope_types

    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return
    found = sorted(rope_types(config.to_dict()) & set(LENGTH_DEPENDENT))
    if found:
        raise UnsupportedConversionError(
            f"the model's rope ({found[0]}) changes its frequencies with the sequence's length, "
            "which TorchScript's exporter freezes at the example's",
            path=src,
            hint="use the dynamo exporter (--onnx-exporter dynamo, the default)",
        )


def _refuse_options(opts: Options) -> None:
    own = opts.of(OnnxOptions)
    asked = [f for name, f in _NOT_WITH.items() if getattr(opts, name, getattr(own, name, None))]
    if asked:
        raise UsageError(
            f"{', '.join(asked)} is not available with --onnx-exporter torchscript",
            hint="use the dynamo exporter (--onnx-exporter dynamo, the default)",
        )


def declared_dims(
    opts: Options,
    sample: dict[str, Any],
    state: RunState,
    axes: list[Any],
    unbatched: set[str],
) -> list[DynamicDim]:
    """The dims the dynamo route would make dynamic (``exporting.dynamic_shapes``: the batch,
    a transformers family's axes, ``--dynamic``, the bounds the check found), each named as
    the ONNX file names it and with the range asked for. ``unbatched``: inputs whose dim 0
    does not follow the batch (a table of fixed rows), left at their size unless ``--dynamic``
    names it: torch.export tells them apart by itself, a trace cannot."""
    from ptconvert.convert.exporting import dynamic_shapes
    from ptconvert.model.axes import AXIS_NAMES
    from ptconvert.options import DYNAMIC_SPEC

    named = {(m["name"], int(m["axis"])) for m in map(DYNAMIC_SPEC.match, opts.dynamic) if m}
    shapes = dynamic_shapes(opts, sample, state.bounds, axes) or {}
    found: list[tuple[str, int, str, int, int | None]] = []
    for name, spec in shapes.items():
        for axis, hint in (spec or {}).items():
            if axis == 0 and name in unbatched and (name, 0) not in named:
                continue
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
    runs: list[tuple[dict[str, Any], dict[str, Any]]], dims: list[DynamicDim]
) -> dict[str, dict[int, str]]:
    """Each output's dims that have a dynamic input dim's size in every run (inputs, outputs)
    given, named as that dim is (when that size belongs to one name only): ``last_hidden_state``
    gets ``batch_size`` and ``sequence_length`` as optimum names them, a classifier's 2 labels
    stay 2 though the trace's batch is 2 too; a dim left out gets the exporter's own name."""
    out: dict[str, dict[int, str]] = {}
    first = runs[0][1]
    for name in first:
        for i in range(first[name].dim()):
            fits = None
            for sample, outputs in runs:
                by_size: dict[int, set[str]] = {}
                for d in dims:
                    by_size.setdefault(sample[d.input].shape[d.axis], set()).add(str(d.symbol))
                here = by_size.get(outputs[name].shape[i], set())
                fits = here if fits is None else fits & here
            if fits is not None and len(fits) == 1:
                out.setdefault(name, {})[i] = next(iter(fits))
    return out


def _another_size(sample: dict[str, Any], dims: list[DynamicDim]) -> dict[str, Any]:
    """``sample`` with every declared dim one larger (one smaller at its maximum)."""
    from ptconvert.verify.probes import resize

    sizes = {}
    for d in dims:
        at = sample[d.input].shape[d.axis]
        up = d.max is None or at + 1 <= d.max
        sizes[d.key] = at + 1 if up else max(d.min, at - 1)
    return resize(sample, sizes)


def trace_export(state: RunState, opts: Options) -> None:
    require("onnx")
    _refuse_options(opts)
    import torch

    from ptconvert.convert.exporting import away_from_the_minimum, family_axes
    from ptconvert.model.wrappers import leaf_tuple

    inputs = away_from_the_minimum(state, opts, require_inputs(state))
    module = state.module
    refuse_length_dependent(module, state.src)
    batch = max(inputs.batch, 2) if opts.dynamic_batch else inputs.batch
    sample = inputs.at(batch)
    others = [n for n, v in sample.items() if not isinstance(v, torch.Tensor)]
    if others:
        raise UnsupportedConversionError(
            f"TorchScript's ONNX exporter takes tensor inputs only; {', '.join(others)} is not one",
            path=state.src,
            hint="use the dynamo exporter (--onnx-exporter dynamo, the default)",
        )
    tensors = module.state_dict().values()  # a tied weight once
    size = sum({t.data_ptr(): t.numel() * t.element_size() for t in tensors}.values())
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
    other = inputs.at(batch + 1)
    unbatched = {n for n, v in sample.items() if v.dim() and other[n].shape[0] == v.shape[0]}
    dims = declared_dims(opts, sample, state, axes, unbatched)
    names = list(sample)
    traced = leaf_tuple(module, names).eval()

    def run(feed: dict[str, Any]) -> dict[str, Any]:
        with torch.no_grad():  # the trace's outputs, by name (a transformers model's cache off)
            return dict(traced.named(*(feed[n] for n in names)))

    outputs = run(sample)
    runs = [(sample, outputs)]
    if dims:
        try:  # which output dims follow the inputs' dynamic dims: seen at a second size
            moved = _another_size(sample, dims)
            runs.append((moved, run(moved)))
        except Exception:  # eager refuses other sizes: named by the one run (the check judges)
            pass
    dynamic_axes: dict[str, dict[int, str]] = {}
    for d in dims:
        dynamic_axes.setdefault(d.input, {})[d.axis] = str(d.symbol)
    for name, axes_of in _output_axes(runs, dims).items():
        dynamic_axes[_output_name(name, names)] = axes_of
    outputs = {_output_name(k, names): v for k, v in outputs.items()}
    own = opts.of(OnnxOptions)
    staged = stage_output(state, external=False)
    try:
        frozen = traced_to_onnx(
            traced, tuple(sample[n] for n in names), staged, names, list(outputs), dynamic_axes,
            own.opset,
        )  # fmt: skip
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise UnsupportedConversionError(
            f"TorchScript's ONNX exporter cannot export this model: {type(exc).__name__}: {first}",
            path=state.src,
            hint="use the dynamo exporter (--onnx-exporter dynamo, the default)",
        ) from None
    written = check_written(staged, state.src)
    opset, taken = written.opset, written.inputs
    state.graph_names = (written.inputs, written.outputs)
    unused = [n for n in names if n not in taken]
    if unused:
        state.notes.append(
            f"the graph has no input {', '.join(unused)}: the model does not use it, and "
            "TorchScript's exporter leaves out what a trace does not read (feed only the "
            "graph's inputs)"
        )
    state.declared = DeclaredDims(tuple(dims))
    from ptconvert.verify.dims import describe

    state.dynamic_range = {d.where: describe(d, dims) for d in dims}
    state.family_axes = list(axes)
    state.notes.append(
        f"ONNX opset {opset} from TorchScript's exporter (--onnx-exporter torchscript): a trace "
        f"at batch {batch}"
        + frozen_words(frozen)
        + (
            "; dynamic dims named "
            + ", ".join(dict.fromkeys(f"{d.symbol} (dim {d.axis})" for d in dims))
            if dims
            else ""
        )
    )
    if own.opset is not None and opset != own.opset:
        state.notes.append(f"--opset {own.opset} was asked for; the exporter wrote opset {opset}")


def traced_to_onnx(
    module: Any,
    args: tuple[Any, ...],
    path: Any,
    inputs: list[str],
    outputs: list[str],
    dynamic_axes: dict[str, dict[int, str]],
    opset: int | None,
) -> int:
    """``module`` traced on ``args`` and written to ``path`` by TorchScript's ONNX exporter,
    inputs and outputs named, ``dynamic_axes`` named dims: ptconvert's one call of it (the
    graph's edge and the decoders with past). Returns how often the tracer warned that a
    Python value was frozen (TracerWarning)."""
    import torch

    with (
        quiet_torch(),
        contextlib.redirect_stdout(io.StringIO()),  # --json owns stdout
        warnings.catch_warnings(record=True) as caught,
        torch.no_grad(),
    ):
        warnings.simplefilter("always", torch.jit.TracerWarning)
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=dynamic_axes,
            opset_version=opset,
            dynamo=False,
        )
    return sum(issubclass(w.category, torch.jit.TracerWarning) for w in caught)


def _output_name(name: str, inputs: list[str]) -> str:
    """An output's name in the graph: its leaf name, unless TorchScript's exporter refuses it
    (a tuple's ``0``) or an input has it: ``output_<name>``."""
    return f"output_{name}" if name[:1].isdigit() or name in inputs else name


def frozen_words(frozen: int, checked: str = "the check compares other sizes") -> str:
    """``; the tracer warned N times …`` for a note (``checked``: what the check does about
    it), or nothing."""
    if not frozen:
        return ""
    return (
        f"; the tracer warned {frozen} time{'s' * (frozen != 1)} that a Python value is frozen "
        f"at the example's ({checked})"
    )
