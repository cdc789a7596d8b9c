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

# the machine's peak ≈ BASE + FACTOR × weights (+ the fp64 copy, 2× weights, under its budget,
# + once more where the written file's runtime holds a copy of its own: TorchScript, ONNX, AOTI;
# a .pt2's fresh interpreter maps its weights from the file). FACTOR: the model, the save's
# buffer of the largest tensor and what the reading holds while it builds (0.93–0.98× weights
# measured on GPT-2 decoders of 204 and 532 M, the raw API's own peak; docs/scale.md)
BASE_BYTES = 1536 * 2**20  # the interpreter, torch, transformers, activations of the checks
FACTOR = 1.25
FP64_BUDGET_BYTES = 512 * 2**20  # parity's fp64 copy is made up to this size


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def available_bytes() -> int | None:
    """Memory this process can still get: ``MemAvailable`` of /proc/meminfo, or less under a
    limit (the cgroup's, as a container sets it, or ``ulimit -v``); None where none is known."""
    known = [n for n in (_meminfo(), _cgroup_room(), _address_room()) if n is not None]
    return min(known) if known else None


def _meminfo() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def _cgroup_room() -> int | None:
    """The cgroup's limit less what it uses (v2: memory.max, v1: memory.limit_in_bytes)."""
    for limit, used in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            text = Path(limit).read_text().strip()
            if text == "max" or int(text) >= 2**60:  # no limit
                return None
            return max(0, int(text) - int(Path(used).read_text()))
        except (OSError, ValueError):
            continue
    return None


def _address_room() -> int | None:
    """``ulimit -v`` (RLIMIT_AS) less this process's address space."""
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit == resource.RLIM_INFINITY:
        return None
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0, limit - pages * resource.getpagesize())


def program_estimate(weight_bytes: int, *, verify: bool = True, copy_runs: bool = True) -> int:
    """Peak memory of all processes converting a model of ``weight_bytes`` to a program and
    checking it; ``copy_runs``: the written file's runtime loads a copy of the weights (every
    program format but pt2, whose check maps them)."""
    if not verify:
        return int(BASE_BYTES + FACTOR * weight_bytes)
    fp64 = 2 * weight_bytes if 2 * weight_bytes <= FP64_BUDGET_BYTES else 0
    return int(BASE_BYTES + (FACTOR + copy_runs) * weight_bytes + fp64)
