"""The state a model's call changes: found on a copy that shares the parameters
(``state_changes``, ``watched_call``: buffers, tensor and number attributes, TorchScript's
attributes through the debug iterator), and a stateful model run from its saved state on every
call (``fresh_each_call``), so that both sides of a comparison start from the same state."""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable
from functools import cache
from typing import Any

from ptconvert import _compat
from ptconvert.verify.parity import run_model

# bookkeeping, never model state: nn.Module's own, and transformers' record of the warnings it
# has logged once (a padded input without a mask sets it on the first call)
_MODULE_INTERNALS = frozenset(
    {
        "_parameters",
        "_buffers",
        "_modules",
        "_non_persistent_buffers_set",
        "training",
        "warnings_issued",
    }
)
_UNTRACKED = object()  # a value whose change is not followed (an object, a function)


def _snap(value: Any, depth: int = 0) -> Any:
    """A copy of ``value`` to compare after a call: tensors, numbers, strings, None, and
    containers of them; anything else is not followed."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if value is None or isinstance(value, (bool, int, float, complex, str)):
        return value
    if isinstance(value, (list, tuple)) and depth < 3 and len(value) <= 1000:
        items = tuple(_snap(v, depth + 1) for v in value)
        return _UNTRACKED if any(i is _UNTRACKED for i in items) else items
    if isinstance(value, dict) and depth < 3 and len(value) <= 1000:
        pairs = tuple((str(k), _snap(v, depth + 1)) for k, v in value.items())
        return _UNTRACKED if any(v is _UNTRACKED for _, v in pairs) else pairs
    return _UNTRACKED


def _same_snap(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        same = a == b
        if a.is_floating_point() or a.is_complex():
            same |= a.isnan() & b.isnan()  # a NaN kept in a buffer is not a change
        return bool(same.all())
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same_snap(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _module_state(module: Any) -> dict[str, tuple[str, Any]]:
    """Buffers, and tensor/number attributes of the module and its submodules, by name."""
    import torch

    out: dict[str, tuple[str, Any]] = {}
    for name, buf in module.named_buffers():
        out[name] = ("buffer", _snap(buf))
    for prefix, sub in module.named_modules():
        if isinstance(sub, torch.jit.ScriptModule):
            try:  # TorchScript keeps its attributes in C++: the debug iterator lists them
                attrs = _compat.torch_api.jit_attributes(sub)
            except Exception:  # a private API: without it only the buffers are followed
                attrs = {}
        else:
            attrs = vars(sub)
        for key, value in attrs.items():
            full = f"{prefix}.{key}" if prefix else key
            if key in _MODULE_INTERNALS or full in out or key.startswith("__"):
                continue
            snap = _snap(value)
            if snap is not _UNTRACKED:
                out[full] = ("attribute", snap)
    return out


def _shared_parameters(module: Any) -> dict[int, Any]:
    """A deepcopy memo that keeps ``module``'s parameters as they are."""
    params = getattr(module, "parameters", None)
    if not callable(params) or not hasattr(module, "named_buffers"):
        return {}
    try:
        return {id(p): p for p in params()}
    except Exception:  # a module whose parameters cannot be listed: copied whole
        return {}


def state_changes(
    module: Any, call_of: Callable[[Any], Callable[..., Any]], inputs: dict[str, Any], who: str
) -> list[str] | None:
    """The state of ``module`` that one call on ``inputs`` changes (``"calls (buffer)"``), found
    on a copy so that ``module`` keeps its initial state; None when it cannot be copied. The
    call goes through ``run_model``: a model that raises says so here."""
    return watched_call(module, call_of, inputs, who)[0]


def watched_call(
    module: Any, call_of: Callable[[Any], Callable[..., Any]], inputs: dict[str, Any], who: str
) -> tuple[list[str] | None, Any]:
    """``state_changes`` and the call's outputs: (None, None) when ``module`` cannot be copied
    (nothing ran). With no change, the outputs are what ``module`` itself gives on ``inputs``."""
    import torch

    try:
        with warnings.catch_warnings():  # torch's deprecation notes from copying pytree specs
            warnings.simplefilter("ignore")
            # the parameters are shared, not copied (a call does not change them, and they
            # are most of the memory); buffers and attributes, what a call may change, are
            probe = copy.deepcopy(module, _shared_parameters(module))
    except Exception:  # some modules cannot be copied: their state is then not checked
        return None, None
    before = _module_state(probe)
    with torch.no_grad():
        outputs = run_model(call_of(probe), copy.deepcopy(inputs), who)
    after = _module_state(probe)
    changed = []
    for name in dict.fromkeys([*before, *after]):
        old, new = before.get(name), after.get(name)
        if old is None or new is None or not _same_snap(old[1], new[1]):
            changed.append(f"{name} ({(old or new or ('state', None))[0]})")
    return changed, outputs


@cache
def _fresh_class() -> type:
    import torch

    class FreshEachCall(torch.nn.Module):
        """Runs a fresh copy of ``pristine`` on every call (a cast casts the pristine copy)."""

        def __init__(
            self, pristine: Any, call_of: Callable[[Any], Callable[..., Any]], calls: int
        ) -> None:
            super().__init__()
            self.pristine = pristine
            self.call_of = call_of
            self.calls = calls

        def forward(self, **kwargs: Any) -> Any:
            with warnings.catch_warnings():  # as in state_changes: copying warns, not the model
                warnings.simplefilter("ignore")
                fresh = copy.deepcopy(self.pristine)
            call = self.call_of(fresh)
            if self.calls == 1:
                return call(**kwargs)
            # several calls in a row: the state each call leaves is what the next one computes
            # with, so a wrong state update shows in the later outputs
            return {f"call {i + 1}": call(**copy.deepcopy(kwargs)) for i in range(self.calls)}

    return FreshEachCall


STATEFUL_CALLS = 3  # a stateful model is compared over this many calls in a row


def fresh_each_call(
    module: Any, call_of: Callable[[Any], Callable[..., Any]], calls: int = 1
) -> Any:
    """An ``nn.Module`` that calls ``call_of(copy.deepcopy(module))``: every call of a stateful
    model starts from the state it was saved with; with ``calls`` > 1 it makes that many calls
    in a row from there and returns each one's outputs (``{"call 1": …, "call 2": …}``)."""
    return _fresh_class()(module, call_of, calls)


@cache
def _restoring_class() -> type:
    import torch

    class AttributesRestored(torch.nn.Module):
        """Calls ``inner`` and puts back the attributes the call set on it or its submodules."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, **kwargs: Any) -> Any:
            saved = [
                (sub, dict(vars(sub)))
                for sub in self.inner.modules()
                if not isinstance(sub, torch.jit.ScriptModule)
            ]
            try:
                return self.inner(**kwargs)
            finally:  # a call that raised halfway leaves what it set, too
                for sub, attrs in saved:
                    now = vars(sub)
                    if len(now) != len(attrs) or any(now.get(k) is not v for k, v in attrs.items()):
                        now.clear()
                        now.update(attrs)

    return AttributesRestored


def attributes_restored(module: Any) -> Any:
    """``module`` (an ``nn.Module``) as one whose every call starts from the attributes it had
    before: a call at one size may rebind a Python attribute the next size computes with
    (transformers' Swin shrinks its window to a small input's resolution and keeps it: every
    later probe compared the program with that window, or raised), which the first call's
    ``state_changes`` never sees. Buffers changed in place are ``fresh_each_call``'s."""
    import torch

    if not isinstance(module, torch.nn.Module) or isinstance(module, torch.jit.ScriptModule):
        return module
    return _restoring_class()(module)
