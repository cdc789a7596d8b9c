"""What a program format gives when it is loaded: something to call on named inputs.

Each program format (TorchScript, pt2, AOTInductor, ONNX) implements ``Format.open`` and returns
a ``Program``: the callable, the inputs it accepts by name (its ``Signature``) and, for the
formats that run in this process, the module itself. Callers have scanned the file first.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class IOSpec:
    """One input or output of a program: dims are ints or symbol names when dynamic."""

    name: str
    dtype: str | None
    shape: list[int | str] | None


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
class Program:
    call: Callable[..., Any]  # called with named inputs
    signature: Signature | None  # None: not known (fed every example input)
    module: Any = None  # an nn.Module / ScriptModule when it runs in this process
    # how a copy of ``module`` becomes a call: a stateful model is run on a fresh copy each time
    call_of: Callable[[Any], Callable[..., Any]] | None = None
    exported: Any = None  # a pt2's ExportedProgram: its dynamic dims are checked at their ends
    dynamic: bool = True  # accepts other batch sizes than its example
    max_batch: int | None = None  # the upper end of a bounded dynamic batch dimension
    # the inputs the file declares (name, dtype, dims: ints or symbol names), when it does
    input_specs: list[IOSpec] | None = None

    def close(self) -> None:
        """Stop the process an isolated runtime runs in (nothing for in-process ones)."""
        close = getattr(self.call, "close", None)
        if close is not None:
            close()


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
