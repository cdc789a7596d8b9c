"""The exported → onnx edge: torch.onnx's dynamo exporter from the ExportedProgram.

Dynamic dims become named symbolic dims as optimum names them (``batch_size``, and a Hugging
Face family's ``sequence_length``, ``decoder_sequence_length``, ``height``/``width``),
``<input>_<axis>`` otherwise, in place of torch's ``s77``); ``--opset N`` picks the opset;
weights go to external data (``NAME.onnx.data``) on request or when the model is over 2 GB,
which one protobuf cannot hold; ``onnx.checker`` runs on the result; ``--onnx-optimize`` runs
onnxscript's optimizer. The files are written in a staging folder beside the output and put in
place together. The exporter's debug metadata (each node's stack trace, module namespace and FX
node, the program's signature: absolute paths of the converting machine, most of a small
model's bytes) is left out unless ``--keep-debug-info``.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

from ptconvert import _compat
from ptconvert.convert.state import RunState
from ptconvert.deps import require
from ptconvert.errors import UnsupportedConversionError
from ptconvert.formats.onnx.options import OnnxOptions
from ptconvert.options import Options
from ptconvert.quiet import quiet_torch

WRAPPER_PREFIX = "model."
PROTOBUF_LIMIT = 2 * 1024**3 - 64 * 1024**2  # one protobuf holds < 2 GB; keep a margin
_SYMBOL = re.compile(r"\bs\d+\b")


def symbol_names(ep: Any) -> dict[str, str]:
    """torch's symbol (``s77``) → the name the ONNX dims get: optimum's (``batch_size``, a
    transformers input's ``AXIS_NAMES``: ``sequence_length``, ``height``, …),
    ``<input>_<axis>`` otherwise."""
    from ptconvert.model.axes import AXIS_NAMES
    from ptconvert.verify.dims import dynamic_dims

    names: dict[str, str] = {}
    for d in dynamic_dims(ep):
        if d.symbol is None or d.symbol in names:
            continue
        batch = d.axis == 0 and all(a == 0 for _, a in d.shared)
        names[d.symbol] = (
            "batch_size" if batch else AXIS_NAMES.get((d.input, d.axis), f"{d.input}_{d.axis}")
        )
    return names


def _rename_dims(model: Any, names: dict[str, str]) -> None:
    import onnx_ir as ir

    def rename(text: str) -> str:
        return _SYMBOL.sub(lambda m: names.get(m.group(0), m.group(0)), text)

    values = [*model.graph.inputs, *model.graph.outputs]
    for node in model.graph.all_nodes() if hasattr(model.graph, "all_nodes") else model.graph:
        values += list(node.outputs)
    for value in values:
        shape = value.shape
        if shape is None:
            continue
        dims = [_dim(d, rename) for d in shape]
        value.shape = ir.Shape(dims)


def _name_values(model: Any, state: RunState) -> None:
    """The graph's inputs and outputs under the model's names: the exporter names them after
    the program's placeholders and last ops (``x_1``, ``layer_norm_4``); users feed ``x`` and
    read ``last_hidden_state``."""
    import copy

    from ptconvert.model.wrappers import leaf_name, output_leaves

    if hasattr(state.module, "config"):
        # a transformers model was exported through a wrapper (model/wrappers.NamedOutputs)
        # that holds it as ``model``: its weights under the checkpoint's own names
        for name, value in list(model.graph.initializers.items()):
            if name.startswith(WRAPPER_PREFIX):
                value.name = name[len(WRAPPER_PREFIX) :]
    inputs = list(model.graph.inputs)
    if state.positional and len(state.positional) == len(inputs):
        for value, name in zip(inputs, state.positional, strict=True):
            value.name = name
    if state.reference is None or state.inputs is None:
        return
    import torch

    with torch.no_grad():
        sample = copy.deepcopy(state.inputs.at(state.inputs.batch))
        leaves = list(output_leaves(state.reference(**sample)))
    outputs = list(model.graph.outputs)
    taken = {v.name for v in inputs}
    names = [leaf_name(k) for k in leaves]
    if len(names) == len(outputs) and len(set(names)) == len(names) and not taken & set(names):
        for value, name in zip(outputs, names, strict=True):
            value.name = name


# metadata_props keys torch.onnx writes for debugging: stack traces (paths of this machine),
# module namespaces and class hierarchies, FX node texts, the ExportedProgram's signature
DEBUG_PREFIXES = ("pkg.torch.", "namespace")


def strip_debug_info(model: Any) -> int:
    """Remove the exporter's debug metadata (``DEBUG_PREFIXES``) from every node, value and
    graph of an onnx-ir model, subgraphs and functions included; returns how many entries went."""
    removed = 0

    def strip(props: dict[str, str]) -> None:
        nonlocal removed
        for key in [k for k in props if k.startswith(DEBUG_PREFIXES)]:
            del props[key]
            removed += 1

    graphs = [*model.graphs(), *model.functions.values()]
    for graph in graphs:
        strip(graph.metadata_props)
        values = [*graph.inputs, *graph.outputs]
        values += graph.initializers.values() if hasattr(graph, "initializers") else []
        for node in graph:  # each subgraph is one of ``graphs``
            strip(node.metadata_props)
            values += node.outputs
        for value in values:
            strip(value.metadata_props)
    strip(model.metadata_props)
    return removed


def _export(ep: Any, opts: Options) -> Any:
    import torch

    quiet = io.StringIO()  # the exporter prints its stages on stdout, which --json owns
    quantizing = bool(opts.quantize)
    with quiet_torch(), contextlib.redirect_stdout(quiet), _one_registry():
        own = opts.of(OnnxOptions)
        # --quantize: optimised, so the weights' transposes are folded into the initializers
        # that onnxruntime's quantizer looks for beside a MatMul
        program = torch.onnx.export(
            ep, dynamo=True, opset_version=own.opset, optimize=own.onnx_optimize or quantizing
        )
    assert program is not None
    if not opts.keep_debug_info:  # every ONNX written, the generation exports' included
        strip_debug_info(program.model)
    return program


_REGISTRIES: dict[str, Any] = {}  # torch.onnx's operator registries built here, by opset


def _one_registry() -> contextlib.AbstractContextManager[Any]:
    """torch.onnx builds its registry of ONNX translations from torchlib on every export
    (0.35 s, 0.7 s the first time); a seq2seq model with past is three exports, ``--to all`` and
    the tests many more. An export here takes the registry an earlier one built for its opset
    (the exporter only reads it: custom translation tables, which add to it, are not used here).
    The hook ``onnx_shared_registry`` (ptconvert/_compat): where this torch keeps its registry
    elsewhere, each export builds its own."""
    return _compat.patched("onnx_shared_registry", registries=_REGISTRIES)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _reason(exc: BaseException) -> str:
    """The line that says what failed: the innermost cause's message, without colour codes.
    The exporter wraps the real error in a page of generic text."""
    inner = exc
    while inner.__cause__ is not None:
        inner = inner.__cause__
    lines = [_ANSI.sub("", line).strip() for line in str(inner).splitlines()]
    line = next((x for x in lines if x), "")
    return f"{type(inner).__name__}: {line}"[:400]


# torch.onnx's failure on an output that is a Python number (a size the export fixed): no
# operator is missing, so --opset cannot help
_NUMBER_OUTPUT = re.compile(r"'(int|float|bool)' object has no attribute 'name'")


def _failure(exc: BaseException, state: RunState) -> UnsupportedConversionError:
    reason = _reason(exc)
    hint = "an operator without an ONNX translation fails here; --opset may help"
    if _NUMBER_OUTPUT.search(reason):
        hint = (
            "the program returns a Python number fixed at export (an ONNX output is a tensor): "
            "make the size it is computed from dynamic (--dynamic NAME:AXIS), or return a tensor"
        )
    return UnsupportedConversionError(
        f"torch.onnx cannot export this program: {reason}",
        path=state.src,
        hint=hint,
    )


def _eager_attention(state: RunState, opts: Options) -> bool:
    """A transformers model whose attention is SDPA: switch it to eager attention and export
    it again (the exporter's decomposition of SDPA followed by a reshape fails on T5). False
    when that does not apply."""
    from ptconvert.convert.exporting import export_module

    model = state.module
    config = getattr(model, "config", None)
    if config is None or _compat.hf.attn_implementation(config) == "eager":
        return False
    if state.inputs is None or not hasattr(model, "set_attn_implementation"):
        return False
    model.set_attn_implementation("eager")
    said = len(state.notes)
    state.exported = export_module(state, opts, state.inputs)
    del state.notes[said:]  # the export's notes were said the first time
    return True


def _dim(d: Any, rename: Any) -> Any:
    """A symbolic dim renamed; one whose "name" is a number (a size TorchScript's converter
    specialised) as that fixed size."""
    import onnx_ir as ir

    if not isinstance(d, ir.SymbolicDim) or not d.value:
        return d
    return int(d.value) if d.value.isdigit() else ir.SymbolicDim(rename(d.value))


def _weight_bytes(ep: Any) -> int:
    tensors = [*ep.state_dict.values(), *ep.constants.values()]
    return sum(t.numel() * t.element_size() for t in tensors if hasattr(t, "element_size"))


def _dims_named(ep: Any, names: dict[Any, str]) -> str:
    """``; dynamic dims named batch_size (dim 0), …``: the names clients see (the inputs a name
    spans are said when it is not all of them)."""
    named: dict[tuple[str, int], list[str]] = {}  # one entry a name and axis
    for d in _named(ep, names):
        named.setdefault((names[d.symbol], d.axis), []).append(d.input)
    if not named:
        return ""
    every = max(named.values(), key=len)
    return "; dynamic dims named " + ", ".join(
        f"{n} (dim {axis}" + ("" if i == every else f" of {', '.join(i)}") + ")"
        for (n, axis), i in named.items()
    )


def onnx_export(state: RunState, opts: Options) -> None:
    require("onnx")
    require("onnxscript")
    assert state.exported is not None and state.output is not None
    try:
        program = _export(state.exported, opts)
    except Exception as exc:
        if not _eager_attention(state, opts):
            raise _failure(exc, state) from exc
        try:  # the same model with the attention transformers writes out in plain ops
            program = _export(state.exported, opts)
        except Exception as again:
            raise _failure(again, state) from again
        state.notes.append(
            "torch.onnx could not translate the model's fused attention (scaled_dot_product_"
            f"attention: {_reason(exc)}); exported again with attn_implementation='eager'"
        )
    ep = state.exported
    _name_values(program.model, state)
    names = symbol_names(ep)
    # always: a size TorchScript's converter fixed comes as a symbolic dim named "2", which
    # onnxruntime would take any size for (and compute the traced size's numbers with)
    _rename_dims(program.model, names)
    if opts.keep_debug_info:  # else ``_export`` stripped it
        state.notes.append(
            "debug info kept (--keep-debug-info): each node's stack trace names source files "
            "of this machine"
        )
    own = opts.of(OnnxOptions)
    size = _weight_bytes(ep)
    external = own.external_data or size > PROTOBUF_LIMIT
    staged = stage_output(state, external)
    program.save(staged, external_data=external)
    if external:
        state.companions = [p for p in staged.parent.iterdir() if p != staged]
        why = "on request" if own.external_data else f"the weights are {size / 1024**3:.1f} GB"
        state.notes.append(
            f"weights in external data ({', '.join(p.name for p in state.companions)}; {why}): "
            "keep the files together"
        )
    written = check_written(staged, state.src)
    state.graph_names = (written.inputs, written.outputs)
    opset = program.model.opset_imports.get("")
    state.notes.append(
        f"ONNX opset {opset}, checked with onnx.checker"
        + _dims_named(ep, names)
        + (
            "; graph optimised with onnxscript's optimizer"
            if own.onnx_optimize or opts.quantize
            else ""
        )
    )
    if opts.quantize:
        from ptconvert.formats.onnx.edges.quantize import quantize_written

        quantize_written(state, opts.quantize, external)
    if own.opset is not None and opset != own.opset:
        state.notes.append(
            f"--opset {own.opset} was asked for; torch's exporter wrote opset {opset} (it "
            "writes the opsets it supports, converting down only where its converter can)"
        )


def stage_output(state: RunState, external: bool) -> Path:
    """Where an exporter writes the ONNX file (``state.staged``): the run's private folder
    beside the output (``atomic_path``: same filesystem, removed with it whatever happens),
    with room for its external data; a program this run wrote and rejected before is removed."""
    assert state.output is not None
    destination = state.destination or state.output
    if state.staged is not None:  # a program written before on this run was rejected
        shutil.rmtree(state.staged.parent, ignore_errors=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=state.output.parent))
    state.staged = stage / destination.name
    if not external:  # a data file beside an output this replaces belonged to the old model
        state.obsolete = [destination.parent / f"{destination.name}.data"]
    return state.staged


class WrittenGraph(NamedTuple):
    """What a written ONNX file states about itself: its ai.onnx opset, its graph's input and
    output names (what ``sess.run`` takes and returns)."""

    opset: int | None
    inputs: list[str]
    outputs: list[str]


def check_written(path: Path, src: Path) -> WrittenGraph:
    """``onnx.checker`` (full check: shape inference too) on a written file, a failure named
    by ``src``; what the file states (``WrittenGraph``)."""
    onnx = require("onnx")
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:
        raise UnsupportedConversionError(
            f"the exported ONNX model ({path.name}) fails onnx.checker: {str(exc)[:300]}",
            path=src,
        ) from None
    model = onnx.load(str(path), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    graph = model.graph
    weights = {t.name for t in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in weights]
    return WrittenGraph(opset, inputs, [o.name for o in graph.output])


def _named(ep: Any, names: dict[str, str]) -> list[Any]:
    from ptconvert.verify.dims import dynamic_dims

    return [d for d in dynamic_dims(ep) if d.symbol in names]
