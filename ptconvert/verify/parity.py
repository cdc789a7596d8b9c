"""Program parity: a candidate runtime against the eager reference, judged like PyTorch's own
benchmark harness (``torch._dynamo.utils.same``).

For every input set (several batch sizes, seeded): eager runs twice first — if it disagrees with
itself the verdict is ``eager_nondeterministic``, not a converter failure. The candidate is then
compared leaf by leaf (tuples, dicts, Hugging Face ModelOutput flattened by path): names, shapes
and dtypes first, then ``allclose`` at the dtype's tolerance; when that fails, the RMSE-ratio rule
decides: with an fp64 run of the eager model as ground truth, the candidate passes if its error
against fp64 is at most ``multiplier × eager's own error + tol / 10``. So precision noise is told
apart from a broken conversion. Cosine similarity is reported as a secondary measure.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ptconvert.report import Report

# dtype → tolerance used as both atol and rtol (PyTorch's harness: fp32 1e-4, half types 1e-3…1e-2)
TOLERANCES: dict[str, float] = {
    "float64": 1e-7,
    "float32": 1e-4,
    "float16": 1e-3,
    "bfloat16": 1e-2,
}
STATUSES = ("pass", "fail_accuracy", "fail_shape", "fail_to_run", "eager_nondeterministic")


@dataclass
class OutputResult(Report):
    name: str
    status: str
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    rmse_vs_fp64: float | None = None  # the candidate's
    eager_rmse_vs_fp64: float | None = None  # eager's own, the yardstick
    outside_tolerance: float = 0.0  # share of elements outside allclose
    cosine: float | None = None
    detail: str = ""


@dataclass
class SizeResult(Report):
    batch: int
    status: str
    outputs: list[OutputResult] = field(default_factory=list)
    detail: str = ""


@dataclass
class ParityReport(Report):
    status: str
    sizes: list[SizeResult] = field(default_factory=list)
    fp64_reference: bool = True
    tolerance: dict[str, float] = field(default_factory=dict)

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


def _to_fp64(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.double()
    if isinstance(value, dict):
        return {k: _to_fp64(v) for k, v in value.items()}
    return value


def fp64_model(reference: Any) -> Any | None:
    """A float64 copy of the eager model, or None when it cannot be made (memory, dtypes)."""
    try:
        return copy.deepcopy(reference).double()
    except Exception:  # some modules cannot be copied or cast; parity then goes without fp64
        return None


def compare(
    reference: Any,
    candidate: Callable[..., Any],
    make_inputs: Callable[[int], dict[str, Any]],
    batches: list[int],
    *,
    tolerances: dict[str, float] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
) -> ParityReport:
    """Run eager (twice), eager in fp64 and the candidate on ``make_inputs(b)`` for every ``b``."""
    import torch

    tols = {**TOLERANCES, **(tolerances or {})}
    ref64 = fp64_model(reference)
    sizes: list[SizeResult] = []
    for b in batches:
        inputs = make_inputs(b)
        with torch.no_grad():
            first = output_leaves(reference(**copy.deepcopy(inputs)))
            second = output_leaves(reference(**copy.deepcopy(inputs)))
            if not all(torch.equal(first[k], second[k]) for k in first):
                sizes.append(
                    SizeResult(b, "eager_nondeterministic", detail="eager ran twice and differed")
                )
                continue
            gold = None
            if ref64 is not None:
                try:
                    gold = output_leaves(ref64(**_to_fp64(copy.deepcopy(inputs))))
                except Exception:  # an fp64 run can fail (dtype-strict ops); then no RMSE rule
                    gold = None
            try:
                got = output_leaves(candidate(**copy.deepcopy(inputs)))
            except Exception as exc:  # the artifact may reject a size: that is the finding
                sizes.append(
                    SizeResult(b, "fail_to_run", detail=f"{type(exc).__name__}: {exc}"[:300])
                )
                continue
        sizes.append(_compare_leaves(b, first, got, gold, tols, atol, rtol))
    status = next((s.status for s in sizes if s.status != "pass"), "pass")
    return ParityReport(status, sizes, ref64 is not None, {k: v for k, v in tols.items()})


def _compare_leaves(
    batch: int,
    ref: dict[str, Any],
    got: dict[str, Any],
    gold: dict[str, Any] | None,
    tols: dict[str, float],
    atol: float | None,
    rtol: float | None,
) -> SizeResult:
    if len(ref) != len(got):
        return SizeResult(batch, "fail_shape", detail=f"{len(ref)} outputs became {len(got)}")
    golds = list(gold.values()) if gold is not None and len(gold) == len(ref) else [None] * len(ref)
    results = [
        _compare_one(name, a, b, g, tols, atol, rtol)
        for (name, a), b, g in zip(ref.items(), got.values(), golds, strict=True)
    ]
    status = next((r.status for r in results if r.status != "pass"), "pass")
    bad = next((r for r in results if r.status != "pass"), None)
    return SizeResult(batch, status, results, bad.detail if bad else "")


def _rmse(x: Any, y: Any) -> float:
    return float(((x.double() - y.double()) ** 2).mean().sqrt()) if x.numel() else 0.0


def _compare_one(
    name: str,
    a: Any,
    b: Any,
    gold: Any,
    tols: dict[str, float],
    atol: float | None,
    rtol: float | None,
) -> OutputResult:
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return OutputResult(
            name,
            "fail_shape",
            detail=f"{name}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}",
        )
    if not a.is_floating_point():
        equal = torch.equal(a, b)
        share = float((a != b).float().mean()) if a.numel() else 0.0
        return OutputResult(
            name,
            "pass" if equal else "fail_accuracy",
            outside_tolerance=share,
            detail="" if equal else f"{name}: {share:.1%} of the values differ",
        )
    dtype = str(a.dtype).removeprefix("torch.")
    tol = tols.get(dtype, 1e-4)
    at, rt = (atol if atol is not None else tol), (rtol if rtol is not None else tol)
    diff = (a.double() - b.double()).abs()
    max_abs = float(diff.max()) if a.numel() else 0.0
    max_rel = float((diff / a.double().abs().clamp_min(1e-12)).max()) if a.numel() else 0.0
    close = torch.isclose(a, b, rtol=rt, atol=at, equal_nan=True)
    outside = float((~close).float().mean()) if a.numel() else 0.0
    cosine = (
        float(
            torch.nn.functional.cosine_similarity(
                a.double().flatten(), b.double().flatten(), dim=0, eps=1e-12
            )
        )
        if a.numel() > 1
        else None
    )
    result = OutputResult(name, "pass", max_abs, max_rel, outside_tolerance=outside, cosine=cosine)
    if gold is not None and gold.shape == a.shape:
        result.rmse_vs_fp64 = _rmse(gold, b)
        result.eager_rmse_vs_fp64 = _rmse(gold, a)
    if bool(close.all()):
        return result
    if result.rmse_vs_fp64 is not None and result.eager_rmse_vs_fp64 is not None:
        multiplier = 3.0 if dtype in ("float16", "bfloat16") or a.numel() < 1000 else 2.0
        limit = multiplier * result.eager_rmse_vs_fp64 + tol / 10
        if result.rmse_vs_fp64 <= limit and not math.isnan(result.rmse_vs_fp64):
            result.detail = f"{name}: outside allclose but within {multiplier}× eager's fp64 error"
            return result
    result.status = "fail_accuracy"
    result.detail = (
        f"{name}: max abs error {max_abs:.3g}, {outside:.1%} of elements outside tolerance "
        f"(atol {at:g}, rtol {rt:g})"
        + (
            f", RMSE vs fp64 {result.rmse_vs_fp64:.3g} "
            f"against eager's {result.eager_rmse_vs_fp64:.3g}"
            if result.rmse_vs_fp64 is not None
            else ""
        )
    )
    return result
