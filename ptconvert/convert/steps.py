"""The converters: one function per edge of the graph, each reading and filling a RunState."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ptconvert.atomic import guarded_file
from ptconvert.convert.state import RunState
from ptconvert.convert.weights import read_source, write_target
from ptconvert.errors import (
    MissingInputError,
    MissingRequirementError,
    UnsupportedConversionError,
)
from ptconvert.model.build import (
    eager_from_code,
    eager_from_pickle,
    eager_from_weights,
    program_sample_inputs,
)
from ptconvert.model.inputs import ExampleInputs
from ptconvert.options import Options
from ptconvert.quiet import quiet_torch
from ptconvert.scan.guard import guard


def build_module(state: RunState, opts: Options) -> None:
    assert state.weights is not None
    eager = eager_from_weights(state.src, state.src_format, state.weights, opts)
    state.module, state.reference, state.inputs = eager.module, eager.reference, eager.inputs
    state.notes += eager.notes


def build_from_code(state: RunState, opts: Options) -> None:
    eager = eager_from_code(opts)
    state.module, state.reference, state.inputs = eager.module, eager.reference, eager.inputs
    state.notes += eager.notes


def unpickle_module(state: RunState, opts: Options) -> None:
    eager = eager_from_pickle(state.src, opts)
    state.module, state.reference, state.inputs = eager.module, eager.reference, eager.inputs
    state.notes += eager.notes


def _require_inputs(state: RunState) -> ExampleInputs:
    if state.inputs is None:
        raise MissingRequirementError(
            "this step needs example inputs",
            path=state.src,
            hint="pass --input NAME:SHAPE:DTYPE (repeatable) or --example-inputs FILE",
        )
    return state.inputs


def export(state: RunState, opts: Options) -> None:
    from ptconvert.convert.exporting import export_module

    state.exported = export_module(state, opts, _require_inputs(state))


def script(state: RunState, opts: Options) -> None:
    from ptconvert.convert.scripting import to_torchscript

    state.scripted = to_torchscript(state, opts)
    if state.writing:  # the route ends at the TorchScript file
        assert state.output is not None
        import torch

        with guarded_file(state.output) as fh:  # a failed write must not abort the process
            torch.jit.save(state.scripted, fh)


def ts_to_exported(state: RunState, opts: Options) -> None:
    from torch._export.converter import TS2EPConverter

    from ptconvert.convert.exporting import dynamic_range_words

    inputs = _require_inputs(state)
    module = state.scripted if state.scripted is not None else _load_torchscript(state, opts)
    sample = inputs.at(max(inputs.batch, 2))  # batch ≥ 2: dodge the 0/1 specialisation
    names = _provided_arguments(module, sample, state.src)
    args = tuple(sample[n] for n in names)
    try:
        with quiet_torch():
            state.exported = TS2EPConverter(module, args).convert()
    except Exception as exc:  # the converter covers a subset of TorchScript; say so plainly
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise UnsupportedConversionError(
            f"torch's TorchScript converter (TS2EPConverter) cannot convert this program: "
            f"{type(exc).__name__}: {first}",
            path=state.src,
            hint="export the original nn.Module instead (--model), if its source is available",
        ) from None
    state.positional = names
    state.dynamic_range = dynamic_range_words(state.exported)
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

    from ptconvert.formats.torchscript_probe import load_in_time

    guard(state.src)
    load_in_time(state.src, opts.load_timeout)  # its __setstate__ may not run unbounded here
    module = torch.jit.load(str(state.src), map_location="cpu")
    if state.reference is None:
        state.reference = module
    return module


def program_weights(state: RunState, opts: Options) -> None:
    """The state dict of a program (TorchScript or ExportedProgram) as a weight set."""
    from ptconvert.formats.weightset import weights_from_tensors

    # on the way to a module the program is loaded anyway (after a clean scan): it is the
    # parity reference and brings its own sample inputs. To a weights file its weights are
    # read symbolically instead (the read_weights edge: planning.inapplicable).
    if state.exported is not None:
        tensors = dict(state.exported.state_dict)
    elif state.src_format == "torchscript":
        tensors = dict(_load_torchscript(state, opts).state_dict())
    else:
        load_pt2(state, opts)
        assert state.exported is not None
        tensors = dict(state.exported.state_dict)
    state.weights = weights_from_tensors(tensors)
    if state.module is None and state.src_format in ("torchscript", "pt2"):
        # read from the file itself: the bitwise check re-reads it with the program's loader
        state.weights.origin, state.weights.format = state.src, state.src_format


def load_pt2(state: RunState, opts: Options) -> None:
    from ptconvert.convert.exporting import dynamic_range_words
    from ptconvert.formats.pt2 import open_exported
    from ptconvert.model.wrappers import keywords_to_positions

    guard(state.src)
    program = open_exported(state.src)
    state.exported = program.exported
    state.dynamic_range = dynamic_range_words(program.exported)
    keyword = program.call is program.module
    if not keyword and program.signature is not None:
        state.positional = list(program.signature.names)  # as it was exported: by position
    if state.reference is None:
        state.reference = (
            program.module
            if keyword or state.positional is None
            else keywords_to_positions(program.module, state.positional)
        )
    if state.inputs is None and state.exported.example_inputs is not None:
        state.inputs = program_sample_inputs(state.exported)


def save_pt2(state: RunState, opts: Options) -> None:
    import torch

    from ptconvert.convert.pt2_save import records_in_place
    from ptconvert.formats.pt2 import without_stack_traces

    assert state.exported is not None and state.output is not None
    # no path of this machine in the file unless --keep-debug-info; a failed write must not
    # abort the process (guarded_file); the weights written from where they lie
    with (
        without_stack_traces(state.exported, opts.keep_debug_info),
        guarded_file(state.output) as fh,
        records_in_place(),
    ):
        torch.export.save(state.exported, fh)


def aoti_compile(state: RunState, opts: Options) -> None:
    from ptconvert.convert.aoti import aoti_compile as compile_package

    compile_package(state, opts)


def onnx_export(state: RunState, opts: Options) -> None:
    from ptconvert.convert.onnx_export import onnx_export as export_onnx

    export_onnx(state, opts)


def pte_export(state: RunState, opts: Options) -> None:
    from ptconvert.convert.pte_export import pte_export as export_pte

    export_pte(state, opts)


STEPS = {
    "read_weights": read_source,
    "write_weights": write_target,
    "build_module": build_module,
    "build_from_code": build_from_code,
    "unpickle_module": unpickle_module,
    "export": export,
    "script": script,
    "ts_to_exported": ts_to_exported,
    "program_weights": program_weights,
    "load_pt2": load_pt2,
    "save_pt2": save_pt2,
    "aoti_compile": aoti_compile,
    "onnx_export": onnx_export,
    "pte_export": pte_export,
}
