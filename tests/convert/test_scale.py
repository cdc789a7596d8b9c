"""Verification that scales with the model: the default batch sizes are chosen by call time."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ptconvert
from ptconvert.convert import engine


def test_the_default_sizes_are_chosen_by_the_models_call_time() -> None:
    assert engine.batches_by_cost(None, 2) == ([1, 2, 3, 5, 7], [])
    assert engine.batches_by_cost(0.001, 2) == ([1, 2, 3, 5, 7], [])  # a small model: all
    assert engine.batches_by_cost(0.2, 2) == ([1, 2, 3, 5], [7])
    assert engine.batches_by_cost(1.0, 2) == ([1, 2, 3], [5, 7])  # 1, 2 and a prime always


def test_a_slow_model_is_compared_at_fewer_sizes_and_the_report_says_so(
    samples: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "COMPARE_SECONDS", 0.0)  # as if each call took long
    report = ptconvert.convert(
        samples["mlp_zip"],
        "pt2",
        tmp_path / "m.pt2",
        model="fixtures.models:MLP",
        inputs=["x:2x8:float32"],
        dynamic_batch=True,
    )
    assert report.parity is not None
    compared = sorted({s.batch for s in report.parity.sizes})
    assert compared[:3] == [1, 2, 3] and 5 not in compared and 7 not in compared
    assert any("would take about" in n and "[5, 7]" in n for n in report.notes), report.notes
    program = torch.export.load(tmp_path / "m.pt2").module()
    assert program(torch.randn(7, 8)).shape == (7, 4)  # still dynamic beyond what was compared
