"""module → TorchScript: ``script`` keeps control flow, ``trace`` records one execution.

``--method auto`` scripts first and falls back to tracing, saying so. Tracer warnings are kept
as notes; the parity check after the conversion runs the result at other batch sizes, which is
where a trace that froze a branch or a shape shows itself.
"""

from __future__ import annotations

import warnings
from typing import Any

from ptconvert.convert.state import Options, RunState
from ptconvert.convert.wrappers import positional_tensors
from ptconvert.errors import MissingRequirementError, UnsupportedConversionError


def to_torchscript(state: RunState, opts: Options) -> Any:
    import torch

    errors: list[str] = []
    if opts.method in ("auto", "script"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                return torch.jit.script(state.module)
        except Exception as exc:  # scripting fails on unsupported Python in many ways
            errors.append(f"script: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}")
            if opts.method == "script":
                raise UnsupportedConversionError(errors[0], path=state.src) from None
    if state.inputs is None:
        raise MissingRequirementError(
            "tracing needs example inputs" + (f" (after {errors[0]})" if errors else ""),
            path=state.src,
            hint="pass --input NAME:SHAPE:DTYPE or --example-inputs FILE",
        )
    sample = state.inputs.at(max(state.inputs.batch, 2))
    module, names = state.module, list(sample)
    if hasattr(module, "config"):  # transformers: the tracer cannot type ModelOutput or caches
        module = positional_tensors(module, names)
        state.positional = names
        state.notes.append(
            "traced a wrapper that takes the inputs positionally "
            f"{names} and returns the output tensors as a flat tuple (use_cache=False)"
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if state.positional:
                args = tuple(sample[n] for n in names)
                traced = torch.jit.trace(module, args, strict=False)
            else:
                traced = torch.jit.trace(module, example_kwarg_inputs=sample, strict=False)
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
