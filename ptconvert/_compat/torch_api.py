"""torch's private APIs that ptconvert calls or reads (no patches): each a hook with its probe.

- ``pytree``: ``torch.utils._pytree`` (flattening model inputs and outputs, treespecs).
- ``export_guards_read`` / ``export_guards_add``: ``ExportedProgram._guards_code``, the guards
  ``.module()`` asserts on each call (read by verify/shape_guards.py, added to by exporting).
- ``draft_export_report``: ``ep._report`` of ``torch.export.draft_export``.
- ``ts2ep_converter``: ``torch._export.converter.TS2EPConverter`` (TorchScript → ExportedProgram).
- ``jit_module_attributes``: ``torch._C._jit_debug_module_iterators(module._c)``.
- ``tensor_version``: ``Tensor._version`` (in-place changes since a copy was made).
- ``module_internals``: ``nn.Module``'s ``_modules``, ``_parameters``, ``_buffers`` dicts.
"""

from __future__ import annotations

import itertools
from typing import Any

from ptconvert._compat.registry import TORCH_TESTED, Hook, available, declare

_PYTREE_NAMES = [
    "tree_leaves",
    "tree_flatten",
    "tree_unflatten",
    "tree_map",
    "keystr",
    "tree_flatten_with_path",
    "treespec_loads",
    "SERIALIZED_TYPE_TO_PYTHON_TYPE",
]


def pytree() -> Any:
    """``torch.utils._pytree``."""
    available("pytree")
    from torch.utils import _pytree

    return _pytree


def _probe_pytree() -> bool:
    from torch.utils import _pytree

    return all(hasattr(_pytree, n) for n in _PYTREE_NAMES)


def _probe_guards() -> bool:
    from torch.export import ExportedProgram

    return "_guards_code" in getattr(ExportedProgram, "__annotations__", {})


def guards_code(ep: Any) -> list[str] | None:
    """The guards torch checks when ``ep`` is called, or None when this torch keeps none."""
    if not available("export_guards_read"):
        return None
    return getattr(ep, "_guards_code", None)


def add_guard(ep: Any, code: str) -> None:
    """A guard of ptconvert's own, which ``torch.export.save`` keeps and ``.module()`` asserts."""
    available("export_guards_add")
    ep._guards_code.append(code)


def draft_report(ep: Any) -> Any:
    """The report ``torch.export.draft_export`` attached to its program, or None."""
    if not available("draft_export_report"):
        return None
    return getattr(ep, "_report", None)


def _probe_draft() -> bool:
    import inspect

    from torch.export import _draft_export

    return "ep._report = " in inspect.getsource(_draft_export)


def ts2ep_converter() -> Any:
    """``torch._export.converter.TS2EPConverter``."""
    available("ts2ep_converter")
    from torch._export.converter import TS2EPConverter

    return TS2EPConverter


def _probe_ts2ep() -> bool:
    from torch._export.converter import TS2EPConverter

    return callable(getattr(TS2EPConverter, "convert", None))


def jit_attributes(module: Any) -> dict[str, Any]:
    """A TorchScript module's attributes (kept in C++), or {} where torch cannot list them."""
    if not available("jit_module_attributes"):
        return {}
    import torch

    iterators = torch._C._jit_debug_module_iterators  # type: ignore[attr-defined]
    return dict(iterators(module._c)["named_attributes"])


def _probe_jit() -> bool:
    import inspect

    import torch

    return callable(getattr(torch._C, "_jit_debug_module_iterators", None)) and (
        "self._c" in inspect.getsource(torch.jit.RecursiveScriptModule.__init__)
    )


_UNVERSIONED = itertools.count(-1, -1)


def tensor_version(tensor: Any) -> int:
    """The tensor's in-place version counter; without it, a number never seen before (whatever
    is keyed by it is made again)."""
    if not available("tensor_version"):
        return next(_UNVERSIONED)
    return int(tensor._version)


def _probe_version() -> bool:
    import torch

    return isinstance(torch.zeros(0)._version, int)


def adopt_children(module: Any, owner: Any) -> None:
    """``module`` holds ``owner``'s children, parameters and buffers under their own names."""
    if available("module_internals"):
        module._modules.update(owner._modules)
        module._parameters.update(owner._parameters)
        module._buffers.update(owner._buffers)
        return
    for name, child in owner.named_children():
        module.add_module(name, child)
    for name, param in owner.named_parameters(recurse=False):
        module.register_parameter(name, param)
    for name, buf in owner.named_buffers(recurse=False):
        module.register_buffer(name, buf)


def _probe_module() -> bool:
    import torch

    empty = torch.nn.Module()
    return all(isinstance(getattr(empty, n, None), dict) for n in _MODULE_DICTS)


_MODULE_DICTS = ("_modules", "_parameters", "_buffers")

for _hook in (
    Hook(
        "pytree",
        "uses torch.utils._pytree (tree_leaves, tree_flatten, tree_map, keystr, "
        "treespec_loads, SERIALIZED_TYPE_TO_PYTHON_TYPE …)",
        "torch",
        TORCH_TESTED,
        _probe_pytree,
        None,
    ),
    Hook(
        "export_guards_read",
        "reads ExportedProgram._guards_code (verify/shape_guards.py)",
        "torch",
        TORCH_TESTED,
        _probe_guards,
        "no guards are read: the range check probes each size instead",
    ),
    Hook(
        "export_guards_add",
        "appends to ExportedProgram._guards_code (a dim bounded at 2 refuses 0 and 1)",
        "torch",
        TORCH_TESTED,
        _probe_guards,
        None,
    ),
    Hook(
        "draft_export_report",
        "reads ep._report of torch.export.draft_export (why an export failed)",
        "torch",
        TORCH_TESTED,
        _probe_draft,
        "the export's error is said without draft_export's report",
    ),
    Hook(
        "ts2ep_converter",
        "calls torch._export.converter.TS2EPConverter (torchscript → exported)",
        "torch",
        TORCH_TESTED,
        _probe_ts2ep,
        None,
    ),
    Hook(
        "jit_module_attributes",
        "calls torch._C._jit_debug_module_iterators on ScriptModule._c (its attributes)",
        "torch",
        TORCH_TESTED,
        _probe_jit,
        "a TorchScript module's attributes are not compared, only its buffers",
    ),
    Hook(
        "tensor_version",
        "reads Tensor._version (whether weights changed in place since a copy was made)",
        "torch",
        TORCH_TESTED,
        _probe_version,
        "the fp64 reference copy is made again for each check",
    ),
    Hook(
        "module_internals",
        "updates nn.Module's _modules, _parameters and _buffers (a method wrapped as a module)",
        "torch",
        TORCH_TESTED,
        _probe_module,
        "add_module, register_parameter and register_buffer, one by one",
    ),
):
    declare(_hook)
