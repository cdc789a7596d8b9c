"""The TorchScript target's converters: a module scripted (or traced), a TorchScript program
converted to an ExportedProgram (torch's TS2EPConverter), and its weights from its loaded state
dict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ptconvert import _compat
from ptconvert.atomic import guarded_file
from ptconvert.convert.graph import Edge
from ptconvert.convert.state import RunState
from ptconvert.convert.steps import program_read, require_inputs
from ptconvert.errors import MissingInputError, MissingRequirementError, UnsupportedConversionError
from ptconvert.formats.torchscript import TorchScriptFormat
from ptconvert.options import Options
from ptconvert.quiet import quiet_torch
from ptconvert.scan.guard import guard


def script(state: RunState, opts: Options) -> None:
    from ptconvert.formats.torchscript.edges.script import to_torchscript

    state.scripted = to_torchscript(state, opts)
    if state.writing:  # the route ends at the TorchScript file
        assert state.output is not None
        import torch

        with guarded_file(state.output) as fh:  # a failed write must not abort the process
            try:
                torch.jit.save(state.scripted, fh)
            except RuntimeError as exc:
                if fh.error is not None:  # the write failed: guarded_file's error
                    raise
                raise _unsaveable(exc, state.src) from exc


def _unsaveable(exc: RuntimeError, src: Path) -> UnsupportedConversionError:
    """A program torch.jit.save refuses: a trace that kept a Python call (an
    autograd.Function's ``apply``) runs in memory but cannot be written."""
    first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")[:300]
    return UnsupportedConversionError(
        f"torch.jit.save cannot save this program: {first}",
        path=src,
        hint="a Python call the trace kept (a torch.autograd.Function, a Python op) has no "
        "TorchScript form: export the model instead (--to pt2), or make it scriptable",
    )


def ts_to_exported(state: RunState, opts: Options) -> None:
    from ptconvert.convert.exporting import dynamic_range_words
    from ptconvert.convert.renamed_inputs import program_names, renamed_where

    converter = _compat.torch_api.ts2ep_converter()

    inputs = require_inputs(state)
    module = state.scripted if state.scripted is not None else _load_torchscript(state, opts)
    sample = inputs.at(max(inputs.batch, 2))  # batch ≥ 2: dodge the 0/1 specialisation
    names = _provided_arguments(module, sample, state.src)
    args = tuple(sample[n] for n in names)
    try:
        with quiet_torch():
            state.exported = converter(module, args).convert()
    except Exception as exc:  # the converter covers a subset of TorchScript; say so plainly
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise UnsupportedConversionError(
            f"torch's TorchScript converter (TS2EPConverter) cannot convert this program: "
            f"{type(exc).__name__}: {first}",
            path=state.src,
            hint="export the original nn.Module instead (--model), if its source is available",
        ) from None
    state.positional = names
    # the converter's input names (x_1) said as the model's (x), as the check says them
    renamed = program_names(state) or {}
    state.dynamic_range = {
        renamed_where(where, renamed): words
        for where, words in dynamic_range_words(state.exported).items()
    }
    state.notes.append(
        "TorchScript converted with torch's TS2EPConverter (branches → torch.cond); "
        f"the program takes its inputs positionally: {names}"
    )


def _provided_arguments(module: Any, sample: dict[str, Any], src: Path) -> list[str]:
    """The TorchScript ``forward``'s arguments the sample gives, in order; a required one it
    lacks (silero-vad's ``sr: int``) is named with its ``--input`` line (exit 5). Arguments
    with defaults are passed up to the first one the sample leaves out."""
    from ptconvert.model.inputs import check_provided, required_inputs

    try:
        check_provided(required_inputs(module), sample, src)
    except MissingRequirementError as exc:  # every route needs the input: none other is tried
        raise MissingInputError(exc.message, path=exc.path, hint=exc.hint) from None
    names = [a.name for a in module.forward.schema.arguments[1:]]
    given = [n in sample for n in names]
    return names[: given.index(False)] if False in given else names


def _load_torchscript(state: RunState, opts: Options) -> Any:
    import torch

    from ptconvert.formats.torchscript.probe import load_in_time

    guard(state.src)
    load_in_time(state.src, opts.load_timeout)  # its __setstate__ may not run unbounded here
    module = torch.jit.load(str(state.src), map_location="cpu")
    if state.reference is None:
        state.reference = module
    return module


def program_weights(state: RunState, opts: Options) -> None:
    """The weights of the TorchScript source, from its loaded state dict: on the way to a module
    it is loaded anyway (after a clean scan), the parity reference with its own sample inputs.
    To a weights file they are read symbolically instead (planning.inapplicable)."""
    from ptconvert.formats.weightset import weights_from_tensors

    state.weights = weights_from_tensors(dict(_load_torchscript(state, opts).state_dict()))
    program_read(state)


_TS = TorchScriptFormat.name
EDGES = [
    Edge("module", _TS, "script", 4, (), "torch.jit.script (or trace)", run=script, captures=True),
    Edge(
        _TS,
        "exported",
        "ts_to_exported",
        4,
        ("example_inputs",),
        "TS2EPConverter",
        run=ts_to_exported,
        captures=True,
    ),
    Edge(
        _TS,
        "weights",
        "program_weights",
        1,
        label="the loaded program's state dict",
        run=program_weights,
    ),
]
