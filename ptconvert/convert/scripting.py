"""module → TorchScript: ``script`` keeps control flow, ``trace`` records one execution.

``--method auto`` scripts first and falls back to tracing, saying so. Tracer warnings are kept
as notes; the parity check after the conversion runs the result at other batch sizes, which is
where a trace that froze a branch or a shape shows itself.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from ptconvert.convert.state import RunState
from ptconvert.errors import MissingRequirementError, UnsupportedConversionError
from ptconvert.model.wrappers import named_outputs, positional_names
from ptconvert.options import Options


def to_torchscript(state: RunState, opts: Options) -> Any:
    import torch

    errors: list[str] = []
    if opts.method in ("auto", "script"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                return torch.jit.script(state.module)
        except Exception as exc:  # scripting fails on unsupported Python in many ways
            errors.append(f"script: {type(exc).__name__}: {script_reason(exc)}")
            if opts.method == "script":
                raise UnsupportedConversionError(errors[0], path=state.src) from None
    if state.inputs is None:
        raise MissingRequirementError(
            "tracing needs example inputs" + (f" (after {errors[0]})" if errors else ""),
            path=state.src,
            hint="pass --input NAME:SHAPE:DTYPE or --example-inputs FILE",
        )
    sample = state.inputs.at(max(state.inputs.batch, 2))
    module = state.module
    names = positional_names(module, list(sample)) or list(sample)
    if hasattr(module, "config"):  # transformers: the tracer cannot type ModelOutput or caches
        module = named_outputs(module, names)
        state.notes.append(
            f"traced a wrapper that takes {names} (the model's own names and order) and returns "
            "a dict of named output tensors (use_cache=False)"
        )
    state.positional = names
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            args = tuple(sample[n] for n in names)
            traced = torch.jit.trace(module, args, strict=False)
        except Exception as exc:  # the tracer fails in many ways; report the first line
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            raise UnsupportedConversionError(
                f"tracing failed: {type(exc).__name__}: {first}"
                + (f" (after {errors[0]})" if errors else ""),
                path=state.src,
            ) from None
    tracer = sorted(
        {str(w.message).splitlines()[0] for w in caught if "Tracer" in type(w.message).__name__}
    )
    if errors:
        state.notes.append(f"scripting failed, traced instead ({errors[0]})")
    state.notes += [f"tracer warning: {t}" for t in tracer]
    return traced


_SCHEMA = re.compile(r"^[\w:.]+\(.*\)\s*->.*:?$")


def script_reason(exc: BaseException) -> str:
    """The line of a TorchScript error a user can act on: TorchScript lists the schemas it
    tried (``aten::pad(Tensor self, …) -> Tensor:``) before saying what did not match."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    telling = [ln for ln in lines if not _SCHEMA.match(ln) and not ln.endswith(":")]
    preferred = next(
        (ln for ln in telling if ln.startswith(("Expected", "Unknown", "Python"))), None
    )
    line = preferred or next(iter(telling), "") or next(iter(lines), "")
    return re.sub(r" at 0x[0-9a-f]+", "", line)[:300]  # no memory addresses in a report
