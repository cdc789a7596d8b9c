"""Accuracy against the float32 model, for a program written at another precision (``--dtype``)
or quantized (``--quantize``): parity says the program computes what eager computes *at its
precision*; this says how far that is from the float32 model the user started from. A program
quantized after its export (ONNX) has no eager model at its precision: it is judged by these
metrics alone, at every size the check runs (``judged_by_accuracy``, in parity's place).
Per output, on the check's own inputs: cosine similarity, the largest error as a fraction of
the reference's largest magnitude, and — for an output of scores (a last dim of several) — how
often the top-1 class agrees. The first two are
judged against thresholds (defaults per dtype; ``--min-cosine``/``--max-error`` set them); a miss
is a VerificationError naming the output and the metric. Top-1 agreement is reported, not
judged: tiny random models have near ties that a half-precision rounding flips."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ptconvert.errors import VerificationError
from ptconvert.report import Report
from ptconvert.verify.closeness import flat_cosine

# (minimum cosine similarity, maximum error / max |reference|) by the program's dtype or
# quantization scheme. int8: a 3.9 M-parameter random Llama's logits at int8 (onnxruntime
# dynamic, torchao weight-only) reach cosine 0.9995 and errors of 2.5–5 % of the largest logit;
# the tests' 2-layer Llama of hidden 32 (weights drawn wide, std 0.3) cosine 0.998 and errors up
# to 10.4 % at some lengths: one logit's error swings far more than the cosine, so cosine is the
# main judge and the error's ceiling leaves room; both still fail a wrong scale or a lost layer
THRESHOLDS: dict[str, tuple[float, float]] = {
    "float32": (0.99999, 1e-4),
    "float16": (0.999, 0.02),
    "bfloat16": (0.99, 0.05),
    "int8": (0.98, 0.15),
}


def thresholds(
    label: str, min_cosine: float | None, max_error: float | None
) -> tuple[float, float]:
    """(min cosine, max error) for a program at ``label`` (a dtype or scheme): the options'
    where given, else ``THRESHOLDS``'."""
    floor, ceiling = THRESHOLDS.get(label, THRESHOLDS["float32"])
    return (
        floor if min_cosine is None else min_cosine,
        ceiling if max_error is None else max_error,
    )


class AccuracyMissed(VerificationError):
    """A program further from the float32 model than the thresholds allow: the precision or
    scheme asked for does it, not the route (another capture computes the same), so the
    conversion tries no other route."""


@dataclass
class OutputAccuracy(Report):
    output: str
    batch: int
    cosine: float
    max_error: float  # max |program − float32| / max |float32|
    top1_agreement: float | None = None  # scores: the fraction of rows whose argmax agrees


@dataclass
class AccuracyReport(Report):
    dtype: str
    status: str  # "pass" | "fail"
    min_cosine: float
    max_error: float
    outputs: list[OutputAccuracy] = field(default_factory=list)

    def summary(self) -> str:
        worst_cos = min((o.cosine for o in self.outputs), default=1.0)
        worst_err = max((o.max_error for o in self.outputs), default=0.0)
        tops = [o.top1_agreement for o in self.outputs if o.top1_agreement is not None]
        top = f", top-1 agreement ≥ {min(tops):.1%}" if tops else ""
        return (
            f"{self.dtype} against float32 eager: cosine ≥ {worst_cos:.6f} (at least "
            f"{self.min_cosine}), error ≤ {worst_err:.2%} of the largest output (at most "
            f"{self.max_error:.2%}){top}"
        )


def measure(
    float_reference: Any,
    candidate: Callable[..., Any],
    make: Callable[[int], dict[str, Any]],
    batches: list[int],
    dtype: str,
    *,
    min_cosine: float | None = None,
    max_error: float | None = None,
    path: Any = None,
) -> AccuracyReport:
    """The candidate (fed ``make(b)``, at ``dtype``) against ``float_reference`` (fed the same
    inputs in float32) at each of ``batches``; VerificationError at the first output whose
    cosine or error misses its threshold."""
    import torch

    from ptconvert.model.precision import cast_floats
    from ptconvert.model.wrappers import output_leaves
    from ptconvert.verify.parity import run_model

    cos_floor, err_ceiling = thresholds(dtype, min_cosine, max_error)
    report = AccuracyReport(dtype, "pass", cos_floor, err_ceiling)
    with torch.no_grad():
        for batch in batches:
            inputs = make(batch)
            want = output_leaves(
                run_model(
                    float_reference,
                    cast_floats(copy.deepcopy(inputs), torch.float32),
                    "the float32 model",
                )
            )
            got = output_leaves(run_model(candidate, copy.deepcopy(inputs), "the program"))
            for (name, a), b in zip(want.items(), got.values(), strict=False):
                if not (isinstance(a, torch.Tensor) and a.is_floating_point()):
                    continue
                report.outputs.append(_metrics(name, batch, a, b))
    for o in report.outputs:
        missed = (
            f"cosine similarity {o.cosine:.6f} < {cos_floor}"
            if o.cosine < cos_floor
            else f"error {o.max_error:.2%} of its largest value > {err_ceiling:.2%}"
            if o.max_error > err_ceiling
            else ""
        )
        if missed:
            report.status = "fail"
            raise AccuracyMissed(
                f"the {dtype} program is further from the float32 model than allowed: output "
                f"{o.output!r} at batch {o.batch}: {missed}",
                path=path,
                hint="--min-cosine / --max-error set the thresholds; float32 without --quantize "
                "keeps the model's precision",
            )
    return report


def _metrics(name: str, batch: int, a: Any, b: Any) -> OutputAccuracy:
    import torch

    x, y = a.detach().double().flatten(), b.detach().double().flatten()
    if x.shape != y.shape:
        return OutputAccuracy(name, batch, 0.0, float("inf"))
    norms = float(torch.linalg.vector_norm(x)) * float(torch.linalg.vector_norm(y))
    cosine = flat_cosine(x, y) if norms > 0 else float(torch.equal(x, y))
    scale = float(x.abs().max()) if x.numel() else 0.0
    largest = float((x - y).abs().max()) if x.numel() else 0.0
    error = largest / scale if scale > 0 else largest
    top1 = None
    if a.dim() >= 2 and a.shape[-1] > 1:
        agree = a.argmax(-1) == b.to(a.dtype).argmax(-1)
        top1 = float(agree.double().mean())
    return OutputAccuracy(name, batch, round(cosine, 8), round(error, 6), top1)
