"""module → TorchScript: ``script`` keeps control flow, ``trace`` records one execution.

``--method auto`` scripts first and falls back to tracing, saying so: when scripting fails, and
when the check refuses the scripted program (the engine runs the step again, ``state.refused``).
Tracer warnings are kept as notes. A trace is traced again on the example with its values
moved (``check_inputs``): a value the trace froze (``n = int(x[0].item())``) gives another graph
there, and the trace is refused; the parity check after the conversion runs the result at other
batch sizes, which is where a trace that froze a branch or a shape shows itself.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from ptconvert.convert.state import RunState
from ptconvert.errors import (
    MissingRequirementError,
    UnsupportedConversionError,
    VerificationError,
)
from ptconvert.model.wrappers import named_outputs, positional_names
from ptconvert.options import Options


def to_torchscript(state: RunState, opts: Options) -> Any:
    import torch

    errors: list[str] = []
    state.another_way = False
    if state.refused:  # the check refused the scripted program: --method auto traces now
        errors.append(f"script: the check refused its program: {state.refused[-1]}")
    elif opts.method in ("auto", "script"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                scripted = torch.jit.script(state.module)
            state.another_way = opts.method == "auto"  # a wrong script is traced instead
            return scripted
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
            traced = torch.jit.trace(module, args, strict=False, check_inputs=[moved(args)])
        except torch.jit.TracingCheckError as exc:
            raise _frozen(exc, errors, state.src) from None
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
    if state.refused:
        state.notes.append(
            f"the scripted program failed the parity check ({state.refused[-1]}); traced instead"
        )
    elif errors:
        state.notes.append(f"scripting failed, traced instead ({errors[0]})")
    state.notes += [f"tracer warning: {t}" for t in tracer]
    return traced


def moved(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` with each tensor's values rolled by one place: the same shapes, dtypes and
    values (ids stay inside the vocabulary, a mask stays 0/1), each at another position. The
    check the batch sizes make cannot show a frozen value when the inputs' rows repeat (an
    ``--example-inputs`` file is repeated to other batch sizes). A one-value number (what
    ``.item()`` reads, a size among them: ``torch.zeros(x.item(), 5)``) has no other place to
    roll to: its value itself is moved by one, towards zero (a size stays a size)."""
    import torch

    def move(a: torch.Tensor) -> torch.Tensor:
        if a.numel() == 1 and a.dtype != torch.bool:
            return (a + (-1 if a.item() > 0 else 1)).to(a.dtype)
        return a.flatten().roll(1).view_as(a).clone()

    return tuple(move(a) if isinstance(a, torch.Tensor) else a for a in args)


def _frozen(exc: Exception, errors: list[str], src: Any) -> VerificationError:
    """A trace whose graph changes with the inputs' values: it froze a value (``.item()``,
    ``int(t)``, a branch on a value) and would return the example's answer for other inputs."""
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return VerificationError(
        "the trace froze a value of its inputs: traced again on the example's values moved "
        f"by one place, it records another graph ({first})"
        + (f" (after {errors[0]})" if errors else ""),
        path=src,
        hint="make the model scriptable (--method script) or exportable (--to pt2), "
        "with the value read as a tensor, not a Python number",
    )


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
