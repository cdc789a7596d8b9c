"""A runtime for every format: something to call on named example inputs.

- weights formats with a model spec (or a Hugging Face directory): the eager module;
- TorchScript: ``torch.jit.load``; pt2: ``torch.export.load(...).module()`` (its own sample
  inputs serve as example inputs); AOTInductor: ``aoti_load_package`` (native code: ``--trust``);
  ONNX: an onnxruntime session (the ``onnx`` extra);
- weights without a model spec: no runtime, compared bitwise instead.
Every file goes through the scanner first. Programs captured positionally are called that way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ptconvert.convert.inputs import ExampleInputs
from ptconvert.convert.state import Options, RunState
from ptconvert.errors import MissingRequirementError
from ptconvert.formats import detect
from ptconvert.scan.guard import guard

WEIGHT_FORMATS = ("pt", "safetensors", "sharded", "hf")


@dataclass
class Runtime:
    path: Path
    format: str
    call: Callable[..., Any] | None  # None: a weights file without a model
    module: Any = None  # an nn.Module when there is one (the fp64 reference needs it)
    inputs: ExampleInputs | None = None
    dynamic: bool = True  # accepts other batch sizes than its example
    max_batch: int | None = None  # the upper end of a bounded dynamic batch dimension


def by_position(fn: Callable[..., Any], names: list[str]) -> Callable[..., Any]:
    """Call ``fn`` positionally, in ``names`` order, with named inputs."""

    def call(**kwargs: Any) -> Any:
        if all(n in kwargs for n in names):
            return fn(*[kwargs[n] for n in names])
        return fn(*kwargs.values())  # placeholder names differ (TS2EP's x_1): input order

    return call


def open_runtime(path: str | Path, opts: Options) -> Runtime:
    from ptconvert.convert import steps

    path = Path(path)
    d = detect(path)
    if d.format in WEIGHT_FORMATS:
        if not (opts.model or d.format == "hf" or (d.format == "pt" and opts.trust)):
            return Runtime(path, d.format, None)
        state = RunState(path, d.format, inputs=steps.user_inputs(opts))
        if d.format == "pt" and opts.trust and not opts.model:
            steps.unpickle_module(state, opts)
        else:
            steps.read_weights_step(state, opts)
            steps.build_module(state, opts)
        return Runtime(path, d.format, state.reference, state.reference, state.inputs)
    if d.format == "torchscript":
        import torch

        guard(path)
        ts = torch.jit.load(str(path), map_location="cpu")
        names = [a.name for a in ts.forward.schema.arguments[1:]]
        return Runtime(path, d.format, by_position(ts, names), ts, steps.user_inputs(opts))
    if d.format == "pt2":
        state = RunState(path, d.format, inputs=steps.user_inputs(opts))
        steps.load_pt2(state, opts)
        ep = state.exported
        names = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
        _args_spec, kwargs_spec = (
            ep.call_spec.in_spec.children() if ep.call_spec.in_spec else ((), None)
        )
        takes_kwargs = bool(getattr(kwargs_spec, "context", None))
        program = ep.module()
        call = program if takes_kwargs else by_position(program, names)
        return Runtime(
            path,
            d.format,
            call,
            program,
            state.inputs,
            bool(ep.range_constraints),
            _max_batch(ep),
        )
    if d.format in ("aoti", "onnx"):
        from ptconvert.verify.isolated import IsolatedRuntime

        # AOTI: its shared library runs native code (needs --trust); ONNX: external data must
        # stay in the model's folder
        guard(path, trust=opts.trust)
        if d.format == "onnx":
            import importlib.util

            if importlib.util.find_spec("onnxruntime") is None:  # say so here, not in the child
                raise MissingRequirementError(
                    "this needs the optional package 'onnxruntime', which is not installed",
                    hint="pip install 'ptconvert[onnx]'",
                )
        # both may leak memory or crash: they run in a spawned process
        runtime = IsolatedRuntime(d.format, str(path))
        return Runtime(path, d.format, runtime, None, steps.user_inputs(opts))
    raise MissingRequirementError(f"no runtime for {d.format} files", path=path)


def _max_batch(ep: Any) -> int | None:
    """The finite upper bound of the first user input's dim 0, when it is dynamic."""
    users = {s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"}
    for node in ep.graph.nodes:
        if node.op != "placeholder" or node.name not in users:
            continue
        shape = getattr(node.meta.get("val"), "shape", None)
        expr = getattr(getattr(shape[0], "node", None), "expr", None) if shape else None
        bound = ep.range_constraints.get(expr) if expr is not None else None
        if bound is None or "oo" in str(bound.upper):  # unbounded (sympy's int_oo)
            return None
        upper = int(bound.upper)
        return upper if upper is not None and upper < 1 << 20 else None
    return None
