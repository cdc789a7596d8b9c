"""Hook ``onnx_shared_registry``: torch.onnx's registry of ONNX translations built once per opset.

torch.onnx builds it from torchlib on every export (``ONNXRegistry.from_torchlib``, 0.35 s,
0.7 s the first time); within the patch an export takes the one an earlier export built, from
the dict the caller passes as ``registries=`` (the exporter only reads it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ptconvert._compat.registry import TORCH_TESTED, Hook, declare, options

NAME = "onnx_shared_registry"


def _registry_class() -> Any:
    from torch.onnx._internal.exporter import _registration

    return _registration.ONNXRegistry


def _probe() -> bool:
    return isinstance(_registry_class().__dict__.get("from_torchlib"), classmethod)


def _apply() -> Callable[[], None]:
    cls = _registry_class()
    build = cls.__dict__["from_torchlib"]

    def shared(klass: Any, *args: Any, **kwargs: Any) -> Any:
        registries = (options(NAME) or {}).get("registries")
        if registries is None:  # a thread outside the patch: torch's own
            return build.__func__(klass, *args, **kwargs)
        key = repr((klass, args, sorted(kwargs.items())))
        if key not in registries:
            registries[key] = build.__func__(klass, *args, **kwargs)
        return registries[key]

    cls.from_torchlib = classmethod(shared)

    def undo() -> None:
        cls.from_torchlib = build

    return undo


declare(
    Hook(
        name=NAME,
        what="patches torch.onnx._internal.exporter._registration.ONNXRegistry.from_torchlib "
        "(one registry of ONNX translations per opset, shared by the exports)",
        package="torch",
        tested=TORCH_TESTED,
        probe=_probe,
        fallback="each export builds its own registry (slower)",
        apply=_apply,
    )
)
