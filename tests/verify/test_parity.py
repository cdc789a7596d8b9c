"""Parity verdicts: deliberately broken conversions fail, correct ones pass, noise is told apart."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from fixtures.models import MLP, seeded
from ptconvert.verify.parity import compare


def _inputs(width: int = 8, dtype: torch.dtype = torch.float32):
    def make(b: int) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(b, width, generator=torch.Generator().manual_seed(b)).to(dtype)}

    return make


BATCHES = [1, 2, 7]


def _positional(program):  # programs captured from forward(x) are called positionally
    return lambda x: program(x)


class Net(nn.Module):
    """forward(x) around a layer (nn.Linear names its input ``input``)."""

    def __init__(self, *layers: nn.Module) -> None:
        super().__init__()
        self.body = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def test_a_correct_conversion_passes() -> None:
    model = seeded(MLP())
    program = torch.export.export(
        model, (torch.randn(2, 8),), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},)
    )
    report = compare(model, _positional(program.module()), _inputs(), BATCHES)
    assert report.status == "pass" and report.fp64_reference
    out = report.sizes[0].outputs[0]
    assert out.rmse_vs_fp64 is not None and out.eager_rmse_vs_fp64 is not None
    assert out.cosine is not None and out.cosine > 0.999


def test_a_perturbed_weight_fails() -> None:
    model = seeded(MLP())
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.fc2.weight[0, 0] += 0.05
    report = compare(model, broken, _inputs(), BATCHES)
    assert report.status == "fail_accuracy"
    bad = report.failed[0]
    assert bad.outputs[0].max_abs_error > 1e-3 and "outside tolerance" in bad.detail


class TwoOutputs(nn.Module):
    def __init__(self, swap: bool = False) -> None:
        super().__init__()
        self.swap = swap

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = x.sin(), x.cos()
        return (b, a) if self.swap else (a, b)


def test_swapped_outputs_fail() -> None:
    report = compare(TwoOutputs(), TwoOutputs(swap=True), _inputs(), BATCHES)
    assert report.status == "fail_accuracy"


def test_a_program_specialised_to_the_example_batch_fails_to_run() -> None:
    model = seeded(MLP())
    program = torch.export.export(model, (torch.randn(2, 8),))  # static batch 2
    report = compare(model, _positional(program.module()), _inputs(), BATCHES)
    assert report.status == "fail_to_run"
    assert [s.status for s in report.sizes] == ["fail_to_run", "pass", "fail_to_run"]


def test_a_trace_that_froze_a_branch_fails() -> None:
    from fixtures.models import ControlFlow

    model = seeded(ControlFlow())
    positive = torch.rand(2, 6) + 0.1
    traced = torch.jit.trace(model, (positive,), check_trace=False)

    def make(b: int) -> dict[str, torch.Tensor]:
        sign = 1.0 if b % 2 else -1.0  # odd sizes take one branch, even the other
        return {"x": sign * (torch.rand(b, 6, generator=torch.Generator().manual_seed(b)) + 0.1)}

    report = compare(model, _positional(traced), make, [1, 2, 3, 4])
    assert report.status == "fail_accuracy"
    assert {s.batch for s in report.failed} == {2, 4}


def test_nondeterministic_eager_is_not_blamed_on_the_converter() -> None:
    model = Net(nn.Linear(8, 8), nn.Dropout(0.5)).train()
    report = compare(model, model, _inputs(), [4])
    assert report.status == "eager_nondeterministic"


@pytest.mark.parametrize(
    ("dtype", "noise", "expected"),
    [
        (torch.float32, 1e-7, "pass"),  # float32 rounding noise
        (torch.float32, 1e-2, "fail_accuracy"),
        (torch.float16, 2e-4, "pass"),  # half-precision noise, within its tolerance
        (torch.bfloat16, 1e-3, "pass"),
        (torch.bfloat16, 5e-1, "fail_accuracy"),
    ],
)
def test_tolerances_depend_on_dtype(dtype: torch.dtype, noise: float, expected: str) -> None:
    base = Net(nn.Linear(16, 16)).to(dtype)

    class Noisy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = base(x)
            return y + noise * torch.ones_like(y)

    report = compare(base, Noisy(), _inputs(16, dtype), [3])
    assert report.status == expected, report.sizes[0].detail


def test_tolerance_overrides() -> None:
    model = seeded(MLP())
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.fc2.bias += 1e-3
    assert compare(model, broken, _inputs(), [2]).status == "fail_accuracy"
    assert compare(model, broken, _inputs(), [2], atol=1e-2).status == "pass"
