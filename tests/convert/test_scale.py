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


FACTORIES = '''
import torch
from torch import nn


class Scaled(nn.Module):
    """A buffer computed in __init__ that no checkpoint holds (persistent=False)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.register_buffer("scale", torch.arange(4.0) + 1, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def plain() -> nn.Module:
    return Plain()


def scaled() -> nn.Module:
    return Scaled()
'''


@pytest.mark.parametrize(
    ("factory", "dtype", "assigned"),
    [
        ("plain", torch.float32, True),  # built on meta, the weights assigned
        ("scaled", torch.float32, False),  # a buffer only __init__ computes: the usual build
        ("plain", torch.float16, False),  # another dtype: the usual load converts it
    ],
)
def test_a_factorys_model_takes_the_weights_without_a_second_copy_when_it_can(
    tmp_path: Path, factory: str, dtype: torch.dtype, assigned: bool
) -> None:
    spec = tmp_path / "nets.py"
    spec.write_text(FACTORIES)
    namespace: dict[str, object] = {}
    exec(compile(FACTORIES, str(spec), "exec"), namespace)
    model = namespace[factory]()  # type: ignore[operator]
    torch.save({k: v.to(dtype) for k, v in model.state_dict().items()}, tmp_path / "w.pt")
    report = ptconvert.convert(
        tmp_path / "w.pt",
        "pt2",
        tmp_path / "m.pt2",
        model=f"{spec}:{factory}",
        inputs=["x:3x8:float32"],
    )
    assert report.check == "parity"
    said = any("built on the meta device" in n for n in report.notes)
    assert said == assigned, report.notes
    model.load_state_dict({k: v.to(dtype).float() for k, v in model.state_dict().items()})
    x = torch.randn(3, 8)
    program = torch.export.load(tmp_path / "m.pt2").module()
    torch.testing.assert_close(program(x), model(x))
    assert all(p.dtype == torch.float32 for p in program.parameters())
