"""Memory: what this process has used, what the machine has free, what a conversion will need.

A program conversion holds the model (its weights once: the exported program and the in-memory
program share them), the weights read while it is built, activations of the runs that check it
and, for models under ``parity.FP64_BUDGET_BYTES``, an fp64 copy. The estimate is read from the
weights' size before anything is loaded; measured on GPT-2 decoders of 45 and 204 M parameters
(docs/scale.md), peak RSS stayed under it.
"""

from __future__ import annotations

import resource
from pathlib import Path

# the machine's peak ≈ BASE + FACTOR × weights (+ the fp64 copy, 2× weights, under its budget):
# this process about twice the weights, and the fresh process that loads the written file
# beside the checks, once more
BASE_BYTES = 1536 * 2**20  # the interpreter, torch, transformers, activations of the checks
FACTOR = 3.0
FP64_BUDGET_BYTES = 512 * 2**20  # parity's fp64 copy is made up to this size


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def available_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo; None where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def program_estimate(weight_bytes: int, *, verify: bool = True) -> int:
    """Peak memory of converting a model of ``weight_bytes`` to a program and checking it
    (without the check: the model and the save's buffer only)."""
    if not verify:
        return int(BASE_BYTES + (FACTOR - 1) * weight_bytes)
    fp64 = 2 * weight_bytes if 2 * weight_bytes <= FP64_BUDGET_BYTES else 0
    return int(BASE_BYTES + FACTOR * weight_bytes + fp64)
