"""A runtime for every format: something to call on named example inputs.

- weights formats with a model spec (or a Hugging Face directory): the eager module;
- TorchScript: ``torch.jit.load``; pt2: ``torch.export.load(...).module()`` (its own sample
  inputs serve as example inputs); AOTInductor: ``aoti_load_package`` (native code: ``--trust``);
  ONNX: an onnxruntime session (the ``onnx`` extra);
- weights without a model spec: no runtime, compared bitwise instead.
Every file goes through the scanner first. Programs captured positionally are called that way.
Every runtime says which inputs it accepts (its ``Signature``): verify feeds both sides exactly
the inputs the candidate takes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ptconvert.errors import MissingRequirementError
from ptconvert.formats import detect
from ptconvert.model.inputs import ExampleInputs
from ptconvert.options import Options
from ptconvert.scan.guard import guard

WEIGHT_FORMATS = ("pt", "safetensors", "sharded", "hf")


@dataclass
class Signature:
    """The inputs a runtime accepts, by name (``forward``'s parameters, a program's inputs)."""

    names: list[str]
    required: list[str]  # those without a default value
    any_name: bool = False  # ``**kwargs``: names it does not list are accepted too
    source: str = ""  # where the names come from ("forward", "ONNX session inputs" …)

    def accepts(self, name: str) -> bool:
        return self.any_name or name in self.names

    def __str__(self) -> str:
        parts = [n if n in self.required else f"{n}=…" for n in self.names]
        return "(" + ", ".join([*parts, *(["**kwargs"] if self.any_name else [])]) + ")"


@dataclass
class Runtime:
    path: Path
    format: str
    call: Callable[..., Any] | None  # None: a weights file without a model
    module: Any = None  # an nn.Module when there is one (the fp64 reference needs it)
    inputs: ExampleInputs | None = None
    dynamic: bool = True  # accepts other batch sizes than its example
    max_batch: int | None = None  # the upper end of a bounded dynamic batch dimension
    signature: Signature | None = None  # None: not known (fed every example input)
    # how a copy of ``module`` becomes a call: a stateful model is run on a fresh copy each time
    call_of: Callable[[Any], Callable[..., Any]] | None = None
    exported: Any = None  # a pt2's ExportedProgram: its dynamic dims are checked at their ends

    @property
    def input_names(self) -> list[str] | None:
        """The names of the inputs it accepts; None when it takes any name (or is unknown)."""
        if self.signature is None or self.signature.any_name:
            return None
        return list(self.signature.names)


def by_position(fn: Callable[..., Any], names: list[str]) -> Callable[..., Any]:
    """Call ``fn`` with named inputs: positionally in ``names`` order while they are given, the
    rest (optional ones after a gap) by keyword."""

    def call(**kwargs: Any) -> Any:
        if kwargs and not set(kwargs) & set(names):
            return fn(*kwargs.values())  # placeholder names differ (TS2EP's x_1): input order
        lead = list(itertools.takewhile(lambda n: n in kwargs, names))
        rest = {k: v for k, v in kwargs.items() if k not in lead}
        return fn(*[kwargs[n] for n in lead], **rest)

    return call


def _same(module: Any) -> Any:
    return module


def module_signature(module: Any, source: str = "forward") -> Signature | None:
    """``module.forward``'s parameters; None when Python cannot tell them."""
    import inspect

    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError, AttributeError):
        return None
    names: list[str] = []
    required: list[str] = []
    any_name = False
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            any_name = True  # names it does not list reach it through *args/**kwargs
            continue
        names.append(p.name)
        if p.default is p.empty:
            required.append(p.name)
    return Signature(names, required, any_name, source)


def open_runtime(path: str | Path, opts: Options) -> Runtime:
    from ptconvert.model import build

    path = Path(path)
    d = detect(path)
    if d.format in WEIGHT_FORMATS:
        if not (opts.model or d.format == "hf" or (d.format == "pt" and opts.trust)):
            return Runtime(path, d.format, None)
        if d.format == "pt" and opts.trust and not opts.model:
            eager = build.eager_from_pickle(path, opts)
        else:
            eager = build.eager_from_weights(path, d.format, build.source_weights(path, opts), opts)
        # a Hugging Face reference wraps the model (named outputs): the model's own forward
        # says what it accepts
        own = eager.module if d.format == "hf" else eager.reference
        return Runtime(
            path,
            d.format,
            eager.reference,
            eager.reference,
            eager.inputs,
            signature=module_signature(own),
            call_of=_same,
        )
    if d.format == "torchscript":
        import torch

        guard(path)
        ts = torch.jit.load(str(path), map_location="cpu")
        args = ts.forward.schema.arguments[1:]
        names = [a.name for a in args]
        required = [a.name for a in args if not a.has_default_value()]
        return Runtime(
            path,
            d.format,
            by_position(ts, names),
            ts,
            build.user_inputs(opts),
            signature=Signature(names, required, source="TorchScript forward"),
            call_of=lambda m: by_position(m, names),
        )
    if d.format == "pt2":
        from ptconvert.formats.pt2 import load_exported

        guard(path)
        ep = load_exported(path)
        inputs = build.user_inputs(opts)
        if inputs is None and ep.example_inputs is not None:
            inputs = build.program_sample_inputs(ep)
        names = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
        args_spec, kwargs_spec = (
            ep.call_spec.in_spec.children() if ep.call_spec.in_spec else (None, None)
        )
        keywords = list(getattr(kwargs_spec, "context", None) or [])
        takes_kwargs = bool(keywords)
        if takes_kwargs:  # the keyword inputs by the names they are called with
            positional = getattr(args_spec, "num_children", 0)
            names = [*names[:positional], *keywords]
        program = ep.module()

        def call_of(m: Any) -> Callable[..., Any]:
            return m if takes_kwargs else by_position(m, names)

        return Runtime(
            path,
            d.format,
            call_of(program),
            program,
            inputs,
            bool(ep.range_constraints),
            _max_batch(ep),
            Signature(names, list(names), source="program inputs"),
            call_of,
            ep,
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
        accepted = runtime.input_names
        signature = (
            None
            if accepted is None
            else Signature(accepted, list(accepted), source="ONNX session inputs")
        )
        return Runtime(path, d.format, runtime, None, build.user_inputs(opts), signature=signature)
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
