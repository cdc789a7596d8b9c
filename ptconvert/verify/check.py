"""``ptconvert verify REFERENCE CANDIDATE``: evidence that two artifacts compute the same.

Weights against weights are compared bitwise. Otherwise both get a runtime, the same seeded
inputs go through both at several batch sizes, and ``parity.compare`` judges every output (with
the reference's fp64 run as ground truth when it is an eager module). The report records the
environment the numbers were measured in.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert.convert.state import Options
from ptconvert.errors import MissingRequirementError, VerificationError
from ptconvert.report import Report
from ptconvert.scan.guard import refuse_unsafe
from ptconvert.verify.parity import ParityReport, compare
from ptconvert.verify.runtime import open_runtime
from ptconvert.verify.weights import WeightsCheck

VARIED_BATCHES = [1, 2, 3, 5, 7]  # 1, 2, primes in the middle: sizes a frozen shape misses


@dataclass
class VerifyReport(Report):
    reference: str
    candidate: str
    kind: str  # "weights" | "program"
    status: str
    batches: list[int] = field(default_factory=list)
    parity: ParityReport | None = None
    weights: WeightsCheck | None = None
    environment: dict[str, Any] = field(default_factory=dict)


def environment() -> dict[str, Any]:
    import sys

    import torch

    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cpu_count": os.cpu_count(),
    }
    if "onnxruntime" in sys.modules:
        env["onnxruntime"] = sys.modules["onnxruntime"].__version__
    return env


def verify(
    reference: str | Path,
    candidate: str | Path,
    opts: Options | None = None,
    *,
    batch_sizes: list[int] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    warn_only: bool = False,
    device: str = "cpu",
) -> VerifyReport:
    """Compare ``candidate`` with ``reference``; VerificationError unless they agree.

    ``device="cuda"`` runs the candidate on the GPU against the CPU reference (and its fp64 run).
    """
    opts = opts or Options()
    refuse_unsafe(reference, candidate)
    ref = open_runtime(reference, opts)
    cand = open_runtime(candidate, opts)
    if ref.call is None and cand.call is None:
        from ptconvert.convert.weights_read import read_weights
        from ptconvert.verify.weights import verify_weights

        try:
            check = verify_weights(read_weights(Path(reference), keep_prefix=True), Path(candidate))
        except VerificationError:
            if not warn_only:
                raise
            check = WeightsCheck("fail")
        return VerifyReport(str(reference), str(candidate), "weights", check.status, weights=check)
    if ref.call is None or cand.call is None:
        missing = reference if ref.call is None else candidate
        raise MissingRequirementError(
            "a weights file can only be compared with a program once it is a module",
            path=missing,
            hint="pass --model pkg.module:factory (or a directory with config.json)",
        )
    inputs = ref.inputs or cand.inputs
    if inputs is None:
        raise MissingRequirementError(
            "no example inputs: the reference and the candidate define none",
            path=reference,
            hint="pass --input NAME:SHAPE:DTYPE (repeatable) or --example-inputs FILE",
        )
    batches = batch_sizes or (VARIED_BATCHES if cand.dynamic else [inputs.batch])
    if not batch_sizes and cand.max_batch and cand.max_batch not in batches:
        # the maximum of a bounded range is a size where off-by-one specialisations show
        batches = sorted(b for b in {*batches, cand.max_batch} if b <= cand.max_batch)
    candidate_call = on_device(cand, device)
    # an eager module as reference also gives the fp64 ground truth (programs cannot be cast)
    parity = compare(ref.call, candidate_call, inputs.at, batches, atol=atol, rtol=rtol)
    report = VerifyReport(
        str(reference),
        str(candidate),
        "program",
        parity.status,
        batches,
        parity,
        environment={**environment(), "device": device},
    )
    if parity.status != "pass" and not warn_only:
        bad = parity.failed[0]
        raise VerificationError(
            f"{candidate} differs from {reference} at batch {bad.batch}: {bad.status} "
            f"({bad.detail})",
            path=candidate,
            hint="--warn-only reports without failing; --atol/--rtol override the tolerances",
        )
    return report


def require_device(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise MissingRequirementError(
            "--device cuda: CUDA is not available on this machine",
            hint="run on a machine with a GPU, or use --device cpu",
        )


def on_device(runtime: Any, device: str) -> Any:
    """The runtime's call with its module and inputs on ``device`` and outputs back on the CPU."""
    if device == "cpu":
        return runtime.call
    import torch
    from torch.utils._pytree import tree_map

    require_device(device)
    if runtime.module is None:
        raise MissingRequirementError(
            f"{runtime.format} runs on the CPU only here", path=runtime.path
        )
    runtime.module.to(device)

    def call(**kwargs: Any) -> Any:
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        out = runtime.call(**moved)
        return tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, out)

    return call
