"""Eager modules from what a file holds: weights with a model spec (``--model`` or a Hugging Face
directory), or a whole pickled module with ``--trust``. The conversion's steps and verify's
runtimes both build their eager models here, the same way."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert.errors import MissingRequirementError, NoWeightsError, UsageError
from ptconvert.formats import FORMATS_BY_NAME
from ptconvert.formats.weightset import WeightSet
from ptconvert.model.hf_inputs import from_hf_model
from ptconvert.model.inputs import ExampleInputs, from_file, from_specs, parse_input
from ptconvert.model.spec import (
    ModelSpec,
    choose_target,
    load_strict,
    module_from_factory,
    module_from_hf,
)
from ptconvert.model.wrappers import named_outputs
from ptconvert.options import Options
from ptconvert.scan.guard import guard
from ptconvert.scan.trusted_load import trusted_load
from ptconvert.weights.read import as_tensors, read_weights


@dataclass
class Eager:
    module: Any  # the nn.Module as built
    reference: Any  # what results are compared through (a transformers model: named outputs)
    inputs: ExampleInputs | None
    notes: list[str] = field(default_factory=list)


def eager_runtime(src: Path, src_format: str, opts: Options) -> Eager | None:
    """The eager model of a weights file, when the options (or the file) say which model it is;
    None when nothing does (weights alone are compared bitwise)."""
    fmt = FORMATS_BY_NAME[src_format]
    whole_module = fmt.may_hold_module and opts.trusts_code and not opts.model
    if not (opts.model or fmt.carries_model_spec or whole_module):
        return None
    if whole_module:
        return eager_from_pickle(src, opts)
    return eager_from_weights(src, src_format, source_weights(src, opts)[0], opts)


def user_inputs(opts: Options) -> ExampleInputs | None:
    """The example inputs the user gave (``--example-inputs`` or ``--input``), if any."""
    if opts.example_inputs is not None:
        return from_file(opts.example_inputs)
    if opts.inputs:
        return from_specs([parse_input(s) for s in opts.inputs], seed=opts.seed)
    return None


def source_weights(
    src: Path, opts: Options, scans: list[Any] | None = None, *, for_model: bool = True
) -> tuple[WeightSet, list[Any]]:
    """The weights of ``src``, after the scan of what loading it reads (trust as the options
    say; ``scans``: done already), and that scan (a check may load a program only when it is
    clean). A file without tensors is no weights with ``--model`` when they are ``for_model``
    (the factory's model as it builds it), an error otherwise."""
    if scans is None:
        scans = guard(  # an index: with its shards
            src, trust=opts.trust, allow=opts.allow, remote_code=opts.trust_remote_code
        )
    try:
        ws = read_weights(
            src, key=opts.key, keep_prefix=opts.keep_prefix, skip_unsupported=opts.skip_unsupported
        )
    except NoWeightsError:
        if not (for_model and opts.model) or opts.skip_unsupported:
            raise
        ws = WeightSet([], "fast", origin=src)
    return ws, scans


CODE_ONLY_NOTE = (
    "no weights were loaded: the model is what its factory built (its own initialisation, or "
    "weights the factory loads itself)"
)


def eager_from_code(opts: Options) -> Eager:
    """The model ``--model`` names, as its factory builds it: a source that is code alone (no
    checkpoint, or one without tensors)."""
    if not opts.model:
        raise MissingRequirementError(
            "a model from code alone needs its factory", hint="pass --model pkg.module:factory"
        )
    model, own_inputs = module_from_factory(ModelSpec(opts.model, opts.model_args))
    return Eager(model, model, user_inputs(opts) or own_inputs, [CODE_ONLY_NOTE])


def eager_from_weights(src: Path, src_format: str, weights: WeightSet, opts: Options) -> Eager:
    """The model the options name (``--model``, or the directory's transformers class) with
    ``weights`` loaded into the object they fit; a checkpoint without tensors (an empty state
    dict) with ``--model`` gives the model as its factory builds it."""
    if opts.model and not weights.entries:
        return eager_from_code(opts)
    if opts.model:
        spec, tensors = ModelSpec(opts.model, opts.model_args), as_tensors(weights)
        assigned = _assigned_on_meta(spec, tensors, src, opts)
        if assigned is None:  # built as usual (random init), the weights copied in
            model, own_inputs = module_from_factory(spec)
            label, target = choose_target(model, list(tensors))
            tied, unexpected = load_strict(target, tensors, src, non_strict=opts.non_strict)
        else:
            model, own_inputs, label, target, tied, unexpected = assigned
        notes = []
        if assigned is not None:
            notes.append(
                "the model was built on the meta device and given the weights themselves "
                "(no random init, no second copy)"
            )
        if target is not model:
            notes.append(f"the weights were loaded into {label}, with their own keys")
        if tied:
            notes.append(f"tied weights restored from their source: {tied}")
        if unexpected:
            notes.append(
                f"--non-strict: {len(unexpected)} key(s) the model does not have were left out: "
                f"{unexpected[:10]}"
            )
        return Eager(model, model, user_inputs(opts) or own_inputs, notes)
    if FORMATS_BY_NAME[src_format].carries_model_spec:
        # the directory was scanned when its weights were read; transformers loads them
        shapes = {e.name: tuple(e.shape) for e in weights.entries}
        loaded = module_from_hf(src, opts.task, shapes, trust_remote_code=opts.trust_remote_code)
        model = loaded.model
        # derived only when none were given: a derivation that fails must not block --input
        inputs = user_inputs(opts) or from_hf_model(model, src, seed=opts.seed)
        # the reference: the same model with use_cache=False and its outputs as named tensors
        return Eager(model, named_outputs(model, list(inputs.at(1))), inputs, loaded.notes)
    raise MissingRequirementError("weights → module needs a model spec", path=src)


def _assigned_on_meta(
    spec: ModelSpec, tensors: dict[str, Any], src: Path, opts: Options
) -> tuple[Any, ExampleInputs | None, str, Any, list[str], list[str]] | None:
    """The factory's model built on the meta device, its parameters and buffers the weights
    themselves (``assign``: no random init, no second copy of the weights; they stay in the
    source's copy-on-write mapping until written). None when that does not give a whole model
    of the factory's own dtypes: a buffer the checkpoint lacks (computed in ``__init__``), a
    factory or a load that fails on meta, a weight of another dtype (the usual load converts
    it). The caller then builds the model as usual."""
    import warnings

    from ptconvert.quiet import is_verbose

    try:  # only the factory's call is on meta: its module is imported as usual
        with warnings.catch_warnings():
            if not is_verbose():  # a factory loading weights of its own: a no-op per tensor
                warnings.filterwarnings("ignore", message=".*to a meta parameter")
            model, own_inputs = module_from_factory(spec, device="meta")
            label, target = choose_target(model, list(tensors))
            dtypes = {k: v.dtype for k, v in model.state_dict().items()}
            tied, unexpected = load_strict(
                target, tensors, src, non_strict=opts.non_strict, assign=True
            )
    except Exception:  # the usual build says what is wrong, if anything
        return None
    if _holds_meta(model):
        return None
    if {k: v.dtype for k, v in model.state_dict().items()} != dtypes:
        return None
    return model, own_inputs, label, target, tied, unexpected


def _holds_meta(value: Any, depth: int = 0, seen: set[int] | None = None) -> bool:
    """Whether a meta tensor is left anywhere the model can reach: parameters, buffers, and
    tensors kept as plain attributes (of modules, of the objects they hold, of the object a
    wrapped bound method belongs to), in lists, tuples and dicts."""
    import torch

    seen = set() if seen is None else seen
    if id(value) in seen or depth > 6:
        return False
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        return value.is_meta
    if isinstance(value, torch.nn.Module):
        held = itertools.chain(value.parameters(), value.buffers())
        if any(t.is_meta for t in held):
            return True
        subs = [m for m in value.modules() if m is not value]
        return any(_holds_meta(v, depth + 1, seen) for v in [*vars(value).values(), *subs])
    owner = getattr(value, "__self__", None)  # a bound method (a wrapped predictor's call)
    if owner is not None and not isinstance(owner, type) and callable(value):
        return _holds_meta(owner, depth + 1, seen)
    if isinstance(value, (list, tuple, set)):
        return any(_holds_meta(v, depth + 1, seen) for v in value)
    if isinstance(value, dict):
        return any(_holds_meta(v, depth + 1, seen) for v in value.values())
    if hasattr(value, "__dict__") and not isinstance(value, type) and depth < 4:
        return any(_holds_meta(v, depth + 1, seen) for v in vars(value).values())
    return False


def eager_from_pickle(src: Path, opts: Options) -> Eager:
    """A whole pickled module, its classes (those ``--trust`` covers, or each named by
    ``--allow``) rebuilt by the default mechanism: nothing else can be called."""
    import torch

    loaded = trusted_load(src, trust=opts.trust, allow=opts.allow, timeout=opts.load_timeout)
    model = loaded.value
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"the pickle holds a {type(model).__name__}, not an nn.Module", path=src)
    classes = sorted({type(m).__module__ + "." + type(m).__qualname__ for m in model.modules()})
    note = (
        "loaded a whole pickled module, its classes rebuilt without running their code "
        f"(admitted by {'--trust' if opts.trust else '--allow'}): {', '.join(classes)}"
    )
    return Eager(model.eval(), model, user_inputs(opts), [*loaded.warnings, note])


def program_sample_inputs(ep: Any) -> ExampleInputs | None:
    """A .pt2's own sample inputs (saved by torch.export.save), named by the signature."""
    from ptconvert.model.inputs import resize_batch

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
