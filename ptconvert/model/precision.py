"""``--dtype`` on a program's route: the eager model cast to the precision asked for before it is
exported (so the program holds and computes in it), its floating example inputs cast the same
way, and a float32 copy of the model kept as the yardstick of the accuracy check
(``verify/accuracy.py``)."""

from __future__ import annotations

import copy
from typing import Any

from ptconvert.model.inputs import ExampleInputs


def at_dtype(
    module: Any, reference: Any, inputs: ExampleInputs | None, dtype: str
) -> tuple[ExampleInputs | None, Any]:
    """Cast ``module`` (and ``reference``, when it is a module of its own) to ``dtype`` in place;
    returns the inputs at that dtype and the float32 reference: a copy taken before the cast
    (a model already in float32 costs its size once more while the conversion runs)."""
    import torch

    target = getattr(torch, dtype)
    float_reference = copy.deepcopy(reference)
    if isinstance(float_reference, torch.nn.Module):
        float_reference.float()
    for model in (module, reference):
        if isinstance(model, torch.nn.Module):
            model.to(target)
    if inputs is None:
        return None, float_reference
    source = inputs

    def make(batch: int) -> dict[str, Any]:
        return cast_floats(source.make(batch), target)

    return ExampleInputs(make, inputs.batch, f"{inputs.source}, floats as {dtype}"), float_reference


def cast_floats(inputs: dict[str, Any], dtype: Any) -> dict[str, Any]:
    """Each floating tensor of ``inputs`` as ``dtype``; integers, booleans, others as they are."""
    import torch

    return {
        k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in inputs.items()
    }
