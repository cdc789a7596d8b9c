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
    for size in report.sizes:
        (out,) = size.outputs
        assert out.outside_tolerance == 0.0 and out.max_abs_error <= 1e-6
        # measured against the fp64 run: eager's float32 error, and the program's of its size
        assert out.eager_rmse_vs_fp64 is not None and 0 < out.eager_rmse_vs_fp64 < 1e-6
        assert out.rmse_vs_fp64 is not None
        assert 0 < out.rmse_vs_fp64 <= 2 * out.eager_rmse_vs_fp64 + 1e-7
        assert out.cosine is not None and out.cosine > 0.999999


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


# --- the RMSE-ratio rule: outside allclose, judged against eager's own error vs fp64 ----------


class Oscillator(nn.Module):
    """A high-frequency feature, sin(3000·x + 10⁴): float32 rounds the argument to ~1e-3, so
    eager itself is ~2e-4 (RMSE) from the fp64 run, well above float32's 1e-4 tolerance."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x * 3000.0 + 10000.0)


def _error_scaled(model: nn.Module, scale: float):
    """A candidate whose error against fp64 is ``scale`` × eager's own, element by element
    (−1: the same error mirrored, as another rounding order gives; 1.9: nearly twice as far)."""

    def candidate(x: torch.Tensor) -> torch.Tensor:
        gold = model(x.double())
        return (gold + scale * (model(x).double() - gold)).float()

    return candidate


@pytest.mark.parametrize(
    ("width", "batches", "scale", "multiplier"),
    [
        (512, [2, 4], -1.0, 2.0),  # ≥ 1000 elements: within 2 × eager's error
        (512, [2, 4], 1.9, 2.0),
        (64, [3], 2.9, 3.0),  # < 1000 elements: within 3 ×
    ],
)
def test_precision_noise_outside_allclose_passes_on_the_rmse_rule(
    width: int, batches: list[int], scale: float, multiplier: float
) -> None:
    model = Oscillator()
    report = compare(model, _error_scaled(model, scale), _inputs(width), batches)
    assert report.status == "pass", [s.detail for s in report.sizes]
    for size in report.sizes:
        (out,) = size.outputs
        assert out.status == "pass" and out.outside_tolerance > 0.1  # allclose failed …
        assert out.eager_rmse_vs_fp64 is not None and out.eager_rmse_vs_fp64 > 1e-4
        assert out.rmse_vs_fp64 == pytest.approx(abs(scale) * out.eager_rmse_vs_fp64, rel=1e-3)
        # … and the verdict came from the RMSE rule, saying so
        assert out.detail == f"output: outside allclose but within {multiplier}× eager's fp64 error"


@pytest.mark.parametrize(
    ("width", "batches", "scale"),
    [
        (512, [2, 4], 2.1),  # just past 2 × eager's error (+ tol/10) at ≥ 1000 elements
        (64, [3], 3.1),  # just past 3 × at < 1000 elements
    ],
)
def test_error_beyond_the_multiplier_of_eagers_own_fails(
    width: int, batches: list[int], scale: float
) -> None:
    model = Oscillator()
    report = compare(model, _error_scaled(model, scale), _inputs(width), batches)
    assert report.status == "fail_accuracy"
    assert [s.status for s in report.sizes] == ["fail_accuracy"] * len(batches)
    out = report.sizes[0].outputs[0]
    assert out.rmse_vs_fp64 is not None and out.eager_rmse_vs_fp64 is not None
    assert out.rmse_vs_fp64 == pytest.approx(scale * out.eager_rmse_vs_fp64, rel=1e-3)
    assert "outside tolerance" in out.detail and "RMSE vs fp64" in out.detail
    assert f"against eager's {out.eager_rmse_vs_fp64:.3g}" in report.sizes[0].detail


@pytest.mark.parametrize(("spikes", "expected"), [(1, "pass"), (16, "fail_accuracy")])
def test_a_few_elements_off_pass_only_within_the_rmse_floor(spikes: int, expected: str) -> None:
    """Eager float32 is ~1e-7 from fp64 here, so the floor tol/10 = 1e-5 decides: one element
    off by 3e-4 among 2048 is RMSE 6.6e-6 (passes), sixteen are 2.7e-5 (fails)."""
    model = seeded(Net(nn.Linear(16, 512)))

    def candidate(x: torch.Tensor) -> torch.Tensor:
        y = model(x).clone()
        y.view(-1)[:spikes] += 3e-4
        return y

    report = compare(model, candidate, _inputs(16), [4])
    out = report.sizes[0].outputs[0]
    assert 0 < out.outside_tolerance <= spikes / 2048 and out.max_abs_error > 2.9e-4
    assert report.status == expected, out.detail
    if expected == "pass":
        assert out.detail.startswith("output: outside allclose but within 2.0×")
    else:
        assert "RMSE vs fp64" in out.detail


def test_determinism_is_judged_at_one_thread_count() -> None:
    """Eager's outputs kept from a call on two threads; the determinism check runs on one:
    both of its calls are made there, as sums split by thread differ in their last bits."""
    from ptconvert.model.wrappers import output_leaves
    from ptconvert.verify.parity import EagerRuns

    def reference(x: torch.Tensor) -> torch.Tensor:
        return x + 1e-6 * torch.get_num_threads()

    before = torch.get_num_threads()
    sample = {"x": torch.ones(2, 3)}
    runs = EagerRuns()
    try:
        torch.set_num_threads(2)
        runs.put(2, sample, output_leaves(reference(**sample)))
        torch.set_num_threads(1)
        report = compare(
            reference, reference, lambda b: sample, [2], determinism="once", eager=runs
        )
    finally:
        torch.set_num_threads(before)
    assert report.status == "pass" and runs.deterministic


class ShrinksItsWindow(nn.Module):
    """As transformers' Swin: an input smaller than the window shrinks the window, and the
    module keeps it (``self.window_size = min(input_resolution)``) for every later call."""

    def __init__(self) -> None:
        super().__init__()
        self.window = 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] < self.window:
            self.window = x.shape[0]
        return x * self.window


def test_each_size_starts_from_the_references_own_attributes() -> None:
    """The check's reference was the module the previous size had changed: after batch 1 its
    window was 1, and every later size compared the program with that (Swin → pt2: a program
    refused, or sizes said to fail where eager "raised"). Each call starts from the attributes
    the reference had."""
    from ptconvert.verify.judging import judge_program

    make = _inputs()
    model, pristine = ShrinksItsWindow(), ShrinksItsWindow()

    def program(x: torch.Tensor) -> torch.Tensor:  # the module at each size, from its start
        return copy.deepcopy(pristine)(x)

    judgement = judge_program(model, program, make, [1, 4, 7], None, lambda: make(4))
    assert judgement.parity.status == "pass", judgement.parity
    assert model.window == 4
