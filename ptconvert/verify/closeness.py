"""How close a candidate's output is to eager's by the accuracy metrics (cosine similarity, the
largest error as a fraction of eager's largest magnitude), shared by parity's comparison (which
judges a quantized program by them: ``judged_by_accuracy``) and ``verify/accuracy.py``'s report."""

from __future__ import annotations

from typing import Any


def flat_cosine(x: Any, y: Any) -> float:
    """Cosine similarity of two flat fp64 tensors (``cosine_similarity`` with eps 1e-12, by two
    dot products and the norms)."""
    import torch

    dot = float(torch.dot(x, y))
    norms = float(torch.linalg.vector_norm(x)) * float(torch.linalg.vector_norm(y))
    return dot / max(norms, 1e-12)


def judged_by_accuracy(result: Any, a64: Any, limits: tuple[float, float]) -> Any:
    """A parity ``OutputResult`` (its cosine and max abs error filled; ``a64`` eager's output,
    flat fp64) passed or failed by ``limits`` (min cosine, max error / max |eager|) instead of a
    tolerance: a quantized program cannot match eager within one, but must stay this close."""
    scale = float(a64.abs().max()) if a64.numel() else 0.0
    error = result.max_abs_error / scale if scale > 0 else result.max_abs_error
    cosine = 1.0 if result.cosine is None else result.cosine
    if cosine >= limits[0] and error <= limits[1]:
        return result
    result.status = "fail_accuracy"
    result.detail = (
        f"{result.name}: cosine {cosine:.6f}, error {error:.2%} of its largest value (judged by "
        f"accuracy: cosine ≥ {limits[0]}, error ≤ {limits[1]:.2%})"
    )
    return result
