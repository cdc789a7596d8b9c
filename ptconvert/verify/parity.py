"""Program parity: the converted artifact, reloaded from disk, against the eager reference.

Both run the same inputs at several batch sizes; every output leaf (tuples, dicts, Hugging Face
ModelOutput) is compared by name, shape and dtype, then numerically. A program that computes
different numbers at another batch size (a frozen branch, a specialised shape) fails here.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from ptconvert.report import Report

# dtype → (rtol, atol); the verify milestone deepens this with an fp64 reference
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-3),
    "bfloat16": (2e-2, 1e-2),
}


@dataclass
class SizeResult(Report):
    batch: int
    status: str  # "pass" | "fail_accuracy" | "fail_shape" | "fail_to_run"
    max_abs_error: float = 0.0
    worst_output: str | None = None
    detail: str = ""


@dataclass
class ParityReport(Report):
    status: str
    sizes: list[SizeResult] = field(default_factory=list)

    @property
    def failed(self) -> list[SizeResult]:
        return [s for s in self.sizes if s.status != "pass"]


def output_leaves(out: Any) -> dict[str, Any]:
    """Every tensor of a model output by its pytree path (ModelOutput as a dict)."""
    import torch
    from torch.utils._pytree import keystr, tree_flatten_with_path

    if hasattr(out, "to_tuple") and hasattr(out, "keys"):  # transformers ModelOutput
        out = dict(out.items())
    pairs, _ = tree_flatten_with_path(out)
    return {keystr(p) or "output": v for p, v in pairs if isinstance(v, torch.Tensor)}


def compare(reference: Any, candidate: Any, make_inputs: Any, batches: list[int]) -> ParityReport:
    """Run both callables on ``make_inputs(batch)`` (deep-copied per run) at every batch size."""
    import torch

    sizes: list[SizeResult] = []
    for b in batches:
        inputs = make_inputs(b)
        with torch.no_grad():
            ref = output_leaves(reference(**copy.deepcopy(inputs)))
            try:
                got = output_leaves(candidate(**copy.deepcopy(inputs)))
            except Exception as exc:  # the artifact may reject a size: that is the finding
                sizes.append(
                    SizeResult(b, "fail_to_run", detail=f"{type(exc).__name__}: {exc}"[:300])
                )
                continue
        sizes.append(_compare_leaves(b, ref, got))
    return ParityReport(next((s.status for s in sizes if s.status != "pass"), "pass"), sizes)


def _compare_leaves(batch: int, ref: dict[str, Any], got: dict[str, Any]) -> SizeResult:
    import torch

    if len(ref) != len(got):
        return SizeResult(batch, "fail_shape", detail=f"{len(ref)} outputs became {len(got)}")
    worst, worst_name = 0.0, None
    for (name, a), b in zip(ref.items(), got.values(), strict=True):
        if a.shape != b.shape or a.dtype != b.dtype:
            return SizeResult(
                batch,
                "fail_shape",
                worst_output=name,
                detail=f"{name}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}",
            )
        if not a.is_floating_point():
            if not torch.equal(a, b):
                return SizeResult(
                    batch, "fail_accuracy", worst_output=name, detail=f"{name} differs"
                )
            continue
        rtol, atol = TOLERANCES.get(str(a.dtype).removeprefix("torch."), (1e-4, 1e-5))
        err = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
        if err > worst:
            worst, worst_name = err, name
        if not torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
            return SizeResult(
                batch,
                "fail_accuracy",
                err,
                name,
                f"{name}: max abs error {err:.3g} (rtol {rtol}, atol {atol})",
            )
    return SizeResult(batch, "pass", worst, worst_name)
