"""The converters between the stages (a target's own are in its package's ``edges``): one
function per edge of the graph, each reading and filling a RunState."""

from __future__ import annotations

from ptconvert.convert.state import RunState
from ptconvert.errors import (
    MissingRequirementError,
)
from ptconvert.model.build import (
    Eager,
    eager_from_code,
    eager_from_pickle,
    eager_from_weights,
)
from ptconvert.model.inputs import ExampleInputs
from ptconvert.options import Options


def build_module(state: RunState, opts: Options) -> None:
    assert state.weights is not None
    _take(state, eager_from_weights(state.src, state.src_format, state.weights, opts), opts)


def build_from_code(state: RunState, opts: Options) -> None:
    _take(state, eager_from_code(opts), opts)


def unpickle_module(state: RunState, opts: Options) -> None:
    _take(state, eager_from_pickle(state.src, opts), opts)


def _take(state: RunState, eager: Eager, opts: Options) -> None:
    """The eager model the route goes on with: at ``--dtype`` when one is asked for (the
    float32 copy kept for the accuracy check)."""
    state.module, state.reference, state.inputs = eager.module, eager.reference, eager.inputs
    state.notes += eager.notes
    if opts.dtype:
        from ptconvert.model.precision import at_dtype

        state.inputs, state.float_reference = at_dtype(
            eager.module, eager.reference, eager.inputs, opts.dtype
        )
        state.notes.append(
            f"the model exported in {opts.dtype}: its floating weights, buffers, inputs and "
            "outputs; checked against eager in it, and against float32 eager by accuracy"
        )
    if opts.quantize:
        _quantize(state, opts.quantize)


def _quantize(state: RunState, scheme: str) -> None:
    """A target that quantizes the module (``Format.quantizes_module``) gets it quantized here,
    before export: the program is compared with the quantized model by parity, and with the
    float32 one by accuracy. The others quantize what they write, in a step of their own."""
    from ptconvert.formats import FORMATS_BY_NAME

    target = FORMATS_BY_NAME.get(state.target)
    if target is None or not target.quantizes_module:
        return
    from ptconvert.model.quantize import quantize_module

    state.float_reference, state.quantized = quantize_module(state.module, state.reference, scheme)
    state.notes.append(
        f"the model quantized before export ({state.quantized.summary()}): checked against the "
        "quantized eager model by parity, and against float32 eager by accuracy"
    )


def require_inputs(state: RunState) -> ExampleInputs:
    if state.inputs is None:
        raise MissingRequirementError(
            "this step needs example inputs",
            path=state.src,
            hint="pass --input NAME:SHAPE:DTYPE (repeatable) or --example-inputs FILE",
        )
    return state.inputs


def export(state: RunState, opts: Options) -> None:
    from ptconvert.convert.exporting import export_module

    state.exported = export_module(state, opts, require_inputs(state))


def program_weights(state: RunState, opts: Options) -> None:
    """The state dict of the program the route holds, as a weight set."""
    from ptconvert.formats.weightset import weights_from_tensors

    assert state.exported is not None
    state.weights = weights_from_tensors(dict(state.exported.state_dict))
    program_read(state)


def program_read(state: RunState) -> None:
    """Weights read from the source program's own loaded state dict (a pt2, a TorchScript
    archive) are the file's: the bitwise check reads it again with the program's loader."""
    from ptconvert.formats import FORMATS_BY_NAME

    assert state.weights is not None
    if state.module is None and FORMATS_BY_NAME[state.src_format].read_step == "program_weights":
        state.weights.origin, state.weights.format = state.src, state.src_format
