"""Modules that give a model a plain calling convention before it is captured.

- ``NamedOutputs``: a Hugging Face model whose output is a plain dict of tensors named by their
  path (``logits``, ``past_key_values.0.key`` …), so that the saved program loads without
  transformers' pytree registrations (a ModelOutput in the output spec does not);
- ``PositionalTensors``: the same flat outputs, inputs taken positionally (what the tracer needs);
- ``CallableModule``: any callable (a predictor's bound method) as an ``nn.Module``.
Built on first use so that importing this module does not import torch.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

_PATH_PART = re.compile(r"\[['\"]?([^'\"\]]+)['\"]?\]|\.(\w+)")


def leaf_name(path: str) -> str:
    """``"['past_key_values'][0]['key']"`` → ``"past_key_values.0.key"``."""
    return ".".join(a or b for a, b in _PATH_PART.findall(path)) or "output"


@cache
def _classes() -> dict[str, type]:
    import torch

    from ptconvert.verify.parity import output_leaves

    def _no_cache(model: Any) -> bool:
        import inspect

        return "use_cache" in inspect.signature(model.forward).parameters

    class NamedOutputs(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model
            self.no_cache = _no_cache(model)

        def forward(self, **kwargs: Any) -> dict[str, Any]:  # signature set per input names
            if self.no_cache:
                kwargs["use_cache"] = False
            return {leaf_name(k): v for k, v in output_leaves(self.model(**kwargs)).items()}

    class PositionalTensors(torch.nn.Module):
        def __init__(self, model: Any, names: list[str]) -> None:
            super().__init__()
            self.model, self.names = model, names
            self.no_cache = _no_cache(model)

        def forward(self, *args: Any) -> tuple[Any, ...]:
            kwargs = dict(zip(self.names, args, strict=True))
            if self.no_cache:
                kwargs["use_cache"] = False
            return tuple(output_leaves(self.model(**kwargs)).values())

    class CallableModule(torch.nn.Module):
        def __init__(self, fn: Any) -> None:
            super().__init__()
            self.fn = fn
            owner = getattr(fn, "__self__", None)
            # the modules the method's object holds become this module's: their weights load
            # and export as ``<attribute>.<name>``
            for attr, value in vars(owner).items() if owner is not None else ():
                if isinstance(value, torch.nn.Module):
                    self.add_module(attr, value)

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.fn(*args, **kwargs)

    return {
        "NamedOutputs": NamedOutputs,
        "PositionalTensors": PositionalTensors,
        "CallableModule": CallableModule,
    }


def named_outputs(model: Any, names: list[str]) -> Any:
    """``model`` taking ``names`` as keyword inputs and returning a dict of named tensors."""
    import inspect

    base: Any = _classes()["NamedOutputs"]
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]

    def forward(self: Any, **kwargs: Any) -> dict[str, Any]:
        return base.forward(self, **kwargs)

    forward.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    cls = type("NamedOutputs", (base,), {"forward": forward})
    return cls(model)


def positional_tensors(model: Any, names: list[str]) -> Any:
    return _classes()["PositionalTensors"](model, names)


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
