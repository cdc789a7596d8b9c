"""The headline rows a benchmark hands to ``benchmarks/all.py``, which prints them in one table.

A benchmark run alone prints its own tables and nothing else changes; run by ``all.py`` (which
sets ``PTCONVERT_BENCH_ROWS`` to a file), each headline measurement is also appended to that file
as one JSON line: what was measured, the reference and its seconds, ptconvert's figure, the
ratio and the goal.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ENV = "PTCONVERT_BENCH_ROWS"


def emit(
    measure: str, reference: str, ref_value: float | None, value: float, goal: float, unit: str
) -> None:
    """One row: ``value`` against ``goal`` in ``unit`` ("×" a ratio to the reference, whose
    seconds are ``ref_value``; "s" seconds, no reference)."""
    path = os.environ.get(ENV)
    if not path:
        return
    row = {
        "measure": measure,
        "reference": reference,
        "ref_value": ref_value,
        "value": value,
        "goal": goal,
        "unit": unit,
    }
    with Path(path).open("a") as f:
        f.write(json.dumps(row) + "\n")
