"""The exported → onnx edge: torch.onnx's dynamo exporter from the ExportedProgram.

Dynamic dims become named symbolic dims (``batch`` for a dynamic batch, ``<input>_<axis>``
otherwise, in place of torch's ``s77``); ``--opset N`` picks the opset; weights go to external
data (``NAME.onnx.data``) on request or when the model is over 2 GB, which one protobuf cannot
hold; ``onnx.checker`` runs on the result; ``--onnx-optimize`` runs onnxscript's optimizer. The
files are written in a staging folder beside the output and put in place together.
"""

from __future__ import annotations

import contextlib
import io
import re
import tempfile
from pathlib import Path
from typing import Any

from ptconvert.convert.state import RunState
from ptconvert.deps import require
from ptconvert.errors import UnsupportedConversionError
from ptconvert.options import Options
from ptconvert.quiet import quiet_torch

PROTOBUF_LIMIT = 2 * 1024**3 - 64 * 1024**2  # one protobuf holds < 2 GB; keep a margin
_SYMBOL = re.compile(r"\bs\d+\b")


def symbol_names(ep: Any, dynamic_batch: bool) -> dict[str, str]:
    """torch's symbol (``s77``) → the name the ONNX dims get."""
    from ptconvert.verify.ranges import dynamic_dims

    names: dict[str, str] = {}
    for d in dynamic_dims(ep):
        if d.symbol is None or d.symbol in names:
            continue
        batch = d.axis == 0 and dynamic_batch and all(a == 0 for _, a in d.shared)
        names[d.symbol] = "batch" if batch else f"{d.input}_{d.axis}"
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
        dims = [
            ir.SymbolicDim(rename(d.value)) if isinstance(d, ir.SymbolicDim) and d.value else d
            for d in shape
        ]
        value.shape = ir.Shape(dims)


def _weight_bytes(ep: Any) -> int:
    tensors = [*ep.state_dict.values(), *ep.constants.values()]
    return sum(t.numel() * t.element_size() for t in tensors if hasattr(t, "element_size"))


def onnx_export(state: RunState, opts: Options) -> None:
    import torch

    require("onnx")
    require("onnxscript")
    assert state.exported is not None and state.output is not None
    ep = state.exported
    quiet = io.StringIO()  # the exporter prints its stages on stdout, which --json owns
    try:
        with quiet_torch(), contextlib.redirect_stdout(quiet):
            program = torch.onnx.export(
                ep, dynamo=True, opset_version=opts.opset, optimize=opts.onnx_optimize
            )
    except Exception as exc:  # the exporter's errors are pages long: the first line says it
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise UnsupportedConversionError(
            f"torch.onnx cannot export this program: {type(exc).__name__}: {first}",
            path=state.src,
            hint="an operator without an ONNX translation fails here; --opset may help",
        ) from None
    assert program is not None
    names = symbol_names(ep, opts.dynamic_batch)
    if names:
        _rename_dims(program.model, names)
        state.notes.append(
            "dynamic dims named in the ONNX graph: "
            + ", ".join(f"{d.input}[{d.axis}] → {names[d.symbol]}" for d in _named(ep, names))
        )
    size = _weight_bytes(ep)
    external = opts.external_data or size > PROTOBUF_LIMIT
    destination = state.destination or state.output
    stage = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=destination.parent))
    state.staged = stage / destination.name
    program.save(state.staged, external_data=external)
    if external:
        state.companions = [p for p in stage.iterdir() if p != state.staged]
        why = "on request" if opts.external_data else f"the weights are {size / 1024**3:.1f} GB"
        state.notes.append(
            f"weights in external data ({', '.join(p.name for p in state.companions)}; {why}): "
            "keep the files together"
        )
    onnx = require("onnx")
    try:
        onnx.checker.check_model(str(state.staged), full_check=True)
    except Exception as exc:
        raise UnsupportedConversionError(
            f"the exported ONNX model fails onnx.checker: {str(exc)[:300]}", path=state.src
        ) from None
    opset = program.model.opset_imports.get("")
    state.notes.append(
        f"ONNX opset {opset}, checked with onnx.checker"
        + ("; graph optimised with onnxscript's optimizer" if opts.onnx_optimize else "")
    )


def _named(ep: Any, names: dict[str, str]) -> list[Any]:
    from ptconvert.verify.ranges import dynamic_dims

    return [d for d in dynamic_dims(ep) if d.symbol in names]
