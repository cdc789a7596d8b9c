"""The converters: one function per edge of the graph, each reading and filling a RunState."""

from __future__ import annotations

from typing import Any

from ptconvert.convert.inputs import (
    ExampleInputs,
    from_file,
    from_hf_model,
    from_specs,
    parse_input,
)
from ptconvert.convert.modelspec import (
    ModelSpec,
    choose_target,
    load_strict,
    module_from_factory,
    module_from_hf,
)
from ptconvert.convert.state import Options, RunState
from ptconvert.convert.weights_read import as_tensors, read_weights
from ptconvert.convert.wrappers import named_outputs
from ptconvert.errors import MissingRequirementError, UnsupportedConversionError, UsageError
from ptconvert.quiet import quiet_torch
from ptconvert.scan.guard import guard


def read_weights_step(state: RunState, opts: Options) -> None:
    guard(state.src, trust=opts.trust)
    state.weights = read_weights(
        state.src,
        key=opts.key,
        keep_prefix=opts.keep_prefix,
        skip_unsupported=opts.skip_unsupported,
    )


def write_safetensors(state: RunState, opts: Options) -> None:
    from ptconvert.convert.weights_write import write_safetensors as write

    assert state.weights is not None and state.output is not None
    write(state.weights, state.output)


def write_pt(state: RunState, opts: Options) -> None:
    from ptconvert.convert.torch_zip import write_torch_zip

    assert state.weights is not None and state.output is not None
    write_torch_zip(state.weights, state.output)


def user_inputs(opts: Options) -> ExampleInputs | None:
    if opts.example_inputs is not None:
        return from_file(opts.example_inputs)
    if opts.inputs:
        return from_specs([parse_input(s) for s in opts.inputs], seed=opts.seed)
    return None


def build_module(state: RunState, opts: Options) -> None:
    assert state.weights is not None
    if opts.model:
        model, inputs = module_from_factory(ModelSpec(opts.model, opts.model_args))
        tensors = as_tensors(state.weights)
        label, target = choose_target(model, list(tensors))
        if target is not model:
            state.notes.append(f"the weights were loaded into {label}, with their own keys")
        tied, unexpected = load_strict(target, tensors, state.src, non_strict=opts.non_strict)
        if tied:
            state.notes.append(f"tied weights restored from their source: {tied}")
        if unexpected:
            state.notes.append(
                f"--non-strict: {len(unexpected)} key(s) the model does not have were left out: "
                f"{unexpected[:10]}"
            )
    elif state.src_format == "hf":
        # the directory was scanned when its weights were read; transformers loads them
        loaded = module_from_hf(state.src, opts.task, [e.name for e in state.weights.entries])
        model = loaded.model
        # derived only when none were given: a derivation that fails must not block --input
        inputs = user_inputs(opts) or from_hf_model(model, state.src, seed=opts.seed)
        state.module, state.inputs = model, inputs
        state.notes += loaded.notes
        # the reference: the same model with use_cache=False and its outputs as named tensors
        state.reference = named_outputs(model, list(inputs.at(1)))
        return
    else:
        raise MissingRequirementError("weights → module needs a model spec", path=state.src)
    state.module = state.reference = model
    state.inputs = user_inputs(opts) or inputs


def unpickle_module(state: RunState, opts: Options) -> None:
    import torch

    scans = guard(state.src, trust=True)  # dangerous is refused even with --trust
    classes = sorted({c for s in scans for c in s.classes})
    state.notes.append(f"loaded a whole pickled module with --trust (imports {classes})")
    model = torch.load(state.src, map_location="cpu", weights_only=False)
    if not isinstance(model, torch.nn.Module):
        raise UsageError(
            f"the pickle holds a {type(model).__name__}, not an nn.Module", path=state.src
        )
    state.module = state.reference = model.eval()
    state.inputs = user_inputs(opts)


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


def ts_to_exported(state: RunState, opts: Options) -> None:
    from torch._export.converter import TS2EPConverter

    from ptconvert.convert.exporting import dynamic_range_words

    inputs = _require_inputs(state)
    module = state.scripted if state.scripted is not None else _load_torchscript(state)
    sample = inputs.at(max(inputs.batch, 2))  # batch ≥ 2: dodge the 0/1 specialisation
    names = [a.name for a in module.forward.schema.arguments[1:]]
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


def _load_torchscript(state: RunState) -> Any:
    import torch

    guard(state.src)
    module = torch.jit.load(str(state.src), map_location="cpu")
    if state.reference is None:
        state.reference = module
    return module


def program_weights(state: RunState, opts: Options) -> None:
    """The state dict of a program (TorchScript or ExportedProgram) as a weight set."""
    from ptconvert.convert.weights_read import weights_from_tensors

    # on the way to a module the program is loaded anyway (after a clean scan): it is the
    # parity reference and brings its own sample inputs. Weights alone go through
    # convert_weights, which reads them symbolically.
    if state.exported is not None:
        tensors = dict(state.exported.state_dict)
    elif state.src_format == "torchscript":
        tensors = dict(_load_torchscript(state).state_dict())
    else:
        load_pt2(state, opts)
        assert state.exported is not None
        tensors = dict(state.exported.state_dict)
    state.weights = weights_from_tensors(tensors)
    if state.module is None and state.src_format in ("torchscript", "pt2"):
        # read from the file itself: the bitwise check re-reads it with the program's loader
        state.weights.origin, state.weights.format = state.src, state.src_format


def load_pt2(state: RunState, opts: Options) -> None:
    from ptconvert.formats.pt2 import load_exported

    guard(state.src)
    state.exported = load_exported(state.src)
    if state.reference is None:
        state.reference = state.exported.module()
    if state.inputs is None and state.exported.example_inputs is not None:
        state.inputs = _program_sample_inputs(state.exported)


def _program_sample_inputs(ep: Any) -> ExampleInputs | None:
    """A .pt2's own sample inputs (saved by torch.export.save), named by the signature."""
    from ptconvert.convert.inputs import resize_batch

    args, kwargs = ep.example_inputs
    names = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    if len(args) > len(names) or not all(hasattr(a, "shape") for a in (*args, *kwargs.values())):
        return None
    sample = {**dict(zip(names, args, strict=False)), **kwargs}  # keyword inputs by their name
    batch = next((t.shape[0] for t in sample.values() if t.dim() > 0), 1)
    return ExampleInputs(
        lambda b: {k: resize_batch(v, b) for k, v in sample.items()},
        batch,
        "the .pt2's sample inputs",
    )


def save_pt2(state: RunState, opts: Options) -> None:
    import torch

    assert state.exported is not None and state.output is not None
    torch.export.save(state.exported, state.output)


STEPS = {
    "read_weights": read_weights_step,
    "write_safetensors": write_safetensors,
    "write_pt": write_pt,
    "build_module": build_module,
    "unpickle_module": unpickle_module,
    "export": export,
    "script": script,
    "ts_to_exported": ts_to_exported,
    "program_weights": program_weights,
    "load_pt2": load_pt2,
    "save_pt2": save_pt2,
}
