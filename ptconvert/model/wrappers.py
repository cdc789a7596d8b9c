"""Modules that give a model a plain calling convention before it is captured.

- ``NamedOutputs``: a Hugging Face model whose output is a plain dict of tensors named by their
  path (``logits``, ``past_key_values.0.key`` …), so that the saved program loads without
  transformers' pytree registrations (a ModelOutput in the output spec does not), and whose
  inputs keep the model's own names (positionally in the model's order, or by keyword);
- ``LeafTuple``: the same taking tensors positionally and returning a tuple, the model's weights
  under their own names (what TorchScript's ONNX exporter traces);
- ``CallableModule``: any callable (a predictor's bound method) as an ``nn.Module``.
Built on first use so that importing this module does not import torch.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from ptconvert import _compat

_PATH_PART = re.compile(r"\[['\"]?([^'\"\]]+)['\"]?\]|\.(\w+)")


def leaf_name(path: str) -> str:
    """``"['past_key_values'][0]['key']"`` → ``"past_key_values.0.key"``."""
    return ".".join(a or b for a, b in _PATH_PART.findall(path)) or "output"


def output_leaves(out: Any) -> dict[str, Any]:
    """Every tensor of a model output by its pytree path (ModelOutput as a dict); a number
    (``x.shape[1] + 1``) as a 0-dim tensor: a program returns it so (ONNX: an int64 tensor),
    and left out it made a right program's output "0 outputs became 1"."""
    import torch

    pytree = _compat.torch_api.pytree()
    if hasattr(out, "to_tuple") and hasattr(out, "keys"):  # transformers ModelOutput
        out = dict(out.items())
    pairs, _ = pytree.tree_flatten_with_path(out)
    return {
        pytree.keystr(p) or "output": v if isinstance(v, torch.Tensor) else torch.tensor(v)
        for p, v in pairs
        if isinstance(v, (torch.Tensor, bool, int, float))
    }


@cache
def _classes() -> dict[str, type]:
    import torch

    def _no_cache(model: Any) -> bool:
        import inspect

        return "use_cache" in inspect.signature(model.forward).parameters

    class NamedOutputs(torch.nn.Module):
        def __init__(self, model: Any, names: list[str]) -> None:
            super().__init__()
            self.model, self.names = model, names
            self.no_cache = _no_cache(model)

        def forward(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # signature: per names
            kwargs = {**dict(zip(self.names, args, strict=False)), **kwargs}
            if self.no_cache:
                kwargs["use_cache"] = False
            return {leaf_name(k): v for k, v in output_leaves(self.model(**kwargs)).items()}

    class LeafTuple(torch.nn.Module):
        """``NamedOutputs`` taking tensors positionally and returning its values as a tuple,
        holding the model's children and weights under their own names: a module TorchScript's
        tracer (and ONNX exporter) takes, whose graph's weights are named as the checkpoint's."""

        named: Any

        def __init__(self, model: Any, names: list[str]) -> None:
            super().__init__()
            _compat.torch_api.adopt_children(self, model)
            # not registered: its weights are this module's own already
            object.__setattr__(self, "named", NamedOutputs(model, names))

        def forward(self, *tensors: Any) -> tuple[Any, ...]:
            return tuple(self.named(*tensors).values())

    class CallableModule(torch.nn.Module):
        def __init__(self, fn: Any) -> None:
            super().__init__()
            self.fn = fn
            owner = getattr(fn, "__self__", None)
            if isinstance(owner, torch.nn.Module):
                # a module's own method: its children, parameters and buffers become this
                # module's under the same names, so its checkpoint's keys load as they are
                _compat.torch_api.adopt_children(self, owner)
                return
            # the modules a plain object (a predictor) holds become this module's: their
            # weights load and export as ``<attribute>.<name>``
            for attr, value in vars(owner).items() if owner is not None else ():
                if isinstance(value, torch.nn.Module):
                    self.add_module(attr, value)

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.fn(*args, **kwargs)

    class KeywordsToPositions(torch.nn.Module):
        def __init__(self, program: Any, names: list[str]) -> None:
            super().__init__()
            self.program, self.names = program, names

        def forward(self, **kwargs: Any) -> Any:
            from ptconvert.formats.program import by_position

            return by_position(self.program, self.names)(**kwargs)

    return {
        "NamedOutputs": NamedOutputs,
        "LeafTuple": LeafTuple,
        "CallableModule": CallableModule,
        "KeywordsToPositions": KeywordsToPositions,
    }


def keywords_to_positions(program: Any, names: list[str]) -> Any:
    """A module that takes its inputs positionally (a program exported so), called by name:
    the form every reference is called in (``reference(**inputs)``)."""
    return _classes()["KeywordsToPositions"](program, names)


def named_outputs(model: Any, names: list[str]) -> Any:
    """``model`` taking ``names`` (positionally, in this order, or by keyword) and returning a
    dict of named tensors: the calling convention of the model itself, without ModelOutput."""
    import inspect

    base: Any = _classes()["NamedOutputs"]
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]

    def forward(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return base.forward(self, *args, **kwargs)

    forward.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    cls = type("NamedOutputs", (base,), {"forward": forward})
    return cls(model, names)


def leaf_tuple(model: Any, names: list[str]) -> Any:
    """``model`` taking ``names`` positionally and returning its output leaves as a tuple, in
    ``output_leaves``' order (``LeafTuple``: the form TorchScript's tracer takes)."""
    return _classes()["LeafTuple"](model, names)


def callable_module(fn: Any) -> Any:
    """``fn`` as an ``nn.Module`` whose forward has ``fn``'s signature."""
    import inspect

    base: Any = _classes()["CallableModule"]

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        return base.forward(self, *args, **kwargs)

    params = list(inspect.signature(fn).parameters.values())
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    forward.__signature__ = inspect.Signature([self_param, *params])  # type: ignore[attr-defined]
    return type("CallableModule", (base,), {"forward": forward})(fn)


def _parameters(module: Any) -> list[Any]:
    import inspect

    try:
        return list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return []


def positional_names(module: Any, names: list[str]) -> list[str] | None:
    """``names`` in forward's order when they are its leading positional parameters."""
    params = _parameters(module)
    leading = [
        p.name
        for p in params[: len(names)]
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return leading if sorted(leading) == sorted(names) else None


def load_targets(model: Any) -> list[tuple[str, Any]]:
    """Where a checkpoint may belong: the model itself and, for a wrapped predictor method, each
    module the predictor holds (a checkpoint of its ``Sam2Model`` has that model's own keys)."""
    targets = [(type(model).__name__, model)]
    owner = getattr(getattr(model, "fn", None), "__self__", None)
    if owner is not None and isinstance(model, _classes()["CallableModule"]):
        import torch

        name = type(owner).__name__
        if isinstance(owner, torch.nn.Module):
            return [(name, model)]
        targets = [(name, model)]
        targets += [
            (f"{name}.{attr} ({type(v).__name__})", v)
            for attr, v in vars(owner).items()
            if isinstance(v, torch.nn.Module)
        ]
    return targets
