"""Verification that scales with the model: the default batch sizes are chosen by call time."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

import ptconvert
from ptconvert.convert import program_check


def test_the_default_sizes_are_chosen_by_the_models_call_time_and_the_steps() -> None:
    by_cost = program_check.batches_by_cost
    assert by_cost(None, 2, 3.0) == ([1, 2, 3, 5, 7], [])
    assert by_cost(0.001, 2, 0.5) == ([1, 2, 3, 5, 7], [])  # a small model: all
    # 0.1 s an item, eager and the program: 1, 2 and 3 take 1.2 s, with 5 2.2 s, with 7 3.6 s
    assert by_cost(0.2, 2, 4.0) == ([1, 2, 3, 5, 7], [])
    assert by_cost(0.2, 2, 2.5) == ([1, 2, 3, 5], [7])
    assert by_cost(0.2, 2, 2.0) == ([1, 2, 3], [5, 7])  # 1, 2 and 3 fill the share
    assert by_cost(1.0, 2, 3.0) == ([1, 2, 3], [5, 7])  # 1, 2 and a prime always
    # the check's optional work is a share of the steps' time, at least MIN_CHECK_SECONDS
    assert program_check.check_seconds(0.1) == program_check.MIN_CHECK_SECONDS
    assert program_check.check_seconds(100.0) == 100.0 * program_check.CHECK_SHARE


def test_one_batch_policy_for_a_conversion_and_verify() -> None:
    """``judging.batches_to_compare``: both checks choose their sizes by it."""
    from ptconvert.verify.judging import batches_to_compare

    static, said = batches_to_compare([1, 8], False, 2)
    assert static == [2] and "the program's batch is static" in said[0]
    assert batches_to_compare(None, False, 2) == ([2], [])
    assert batches_to_compare([8, 1, 8], True, 2) == ([8, 1], [])
    assert batches_to_compare(None, True, 2) == ([1, 2, 3, 5, 7], [])
    # a bounded range: its maximum compared, nothing above it
    assert batches_to_compare(None, True, 2, max_batch=4)[0] == [1, 2, 3, 4]
    slow, said = batches_to_compare(None, True, 2, cost=lambda sizes: sum(sizes), seconds=12.0)
    assert slow == [1, 2, 3, 5] and "[7] would take about 7 s more" in said[0]


def test_probes_reach_above_the_example_as_far_as_the_steps_allow() -> None:
    from ptconvert.verify.probes import DEFAULT_BUDGET

    assert program_check.probe_budget(0.001, 0.5) == DEFAULT_BUDGET  # a tiny model: 16×
    assert program_check.probe_budget(0.5, 3.0) == 2
    # a call as long as the steps' share: no probe above the example's size
    assert program_check.probe_budget(2.7, 3.2) == 1


def test_a_slow_model_is_compared_at_fewer_sizes_and_the_report_says_so(
    samples: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(program_check, "CHECK_SHARE", 0.0)  # as if each call took long
    monkeypatch.setattr(program_check, "MIN_CHECK_SECONDS", 0.0)
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


COUNTED = '''
import os

import torch
from torch import nn


class Counted(nn.Module):
    """Writes a line per eager call on real tensors (not export's fake ones): size and dtype."""

    def __init__(self, fails: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.fails = fails

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if type(x) is torch.Tensor:
            with open(os.environ["CALLS_LOG"], "a") as log:
                log.write(f"{x.shape[0]} {x.dtype}\\n")
        if self.fails:
            raise ValueError("this model always fails")
        return self.fc(x)


def counted() -> nn.Module:
    return Counted()


def failing() -> nn.Module:
    return Counted(fails=True)
'''


def _factory(tmp_path: Path, source: str, factory: str, call: bool = False) -> tuple[Path, Path]:
    """``source`` written as a model file and the state dict of ``factory``'s model (called
    once first with ``call``: a lazy module's weights exist after it)."""
    spec = tmp_path / "nets_under_test.py"
    spec.write_text(source)
    namespace: dict[str, object] = {}
    exec(compile(source, str(spec), "exec"), namespace)
    model = namespace[factory]()  # type: ignore[operator]
    if call:
        model(torch.randn(2, 8))
    torch.save(model.state_dict(), tmp_path / "w.pt")
    return spec, tmp_path / "w.pt"


def _counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    log = tmp_path / "calls.log"
    monkeypatch.setenv("CALLS_LOG", str(log))
    spec, weights = _factory(tmp_path, COUNTED, "counted")
    return spec, log, weights


def _convert_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **options: Any
) -> tuple[Any, Path]:
    spec, log, weights = _counted(tmp_path, monkeypatch)
    report = ptconvert.convert(
        weights,
        "pt2",
        tmp_path / "m.pt2",
        model=f"{spec}:counted",
        inputs=["x:2x8:float32"],
        **options,
    )
    return report, log


def _calls(log: Path) -> list[tuple[int, str]]:
    lines = log.read_text().split("\n") if log.exists() else []
    return [(int(n), dtype) for n, dtype in (line.split() for line in lines if line)]


def test_eager_runs_once_per_size_and_twice_on_one_input_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report, log = _convert_counted(tmp_path, monkeypatch, dynamic_batch=True)
    assert report.parity is not None and report.parity.status == "pass"
    compared = [s.batch for s in report.parity.sizes]
    assert compared == [1, 2, 3, 5, 7]
    fp32 = [n for n, dtype in _calls(log) if dtype == "torch.float32"]
    # one size twice (the determinism check: the example's, or a size first run beside the
    # fresh process, at its thread count), every other size once: the batch sizes and the
    # probes of the dynamic range share eager's outputs where their sizes meet
    assert sorted(fp32.count(n) for n in set(fp32))[-2:] == [1, 2], fp32
    assert set(compared) <= set(fp32) and max(fp32) > 7  # the range's top was probed too
    assert torch.export.load(tmp_path / "m.pt2").module()(torch.randn(9, 8)).shape == (9, 4)


def test_without_the_check_the_model_never_runs_eagerly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report, log = _convert_counted(tmp_path, monkeypatch, verify=False)
    assert report.check == "none" and _calls(log) == []  # export traced it on fake tensors
    assert torch.export.load(tmp_path / "m.pt2").module()(torch.randn(2, 8)).shape == (2, 4)


def _children() -> list[int]:
    me = str(os.getpid())
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if entry.name.isdigit() and fields[1] == me and fields[0] != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_model_that_raises_is_said_as_such_when_capture_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ptconvert.errors import ModelRaisedError

    spec, log, weights = _counted(tmp_path, monkeypatch)
    before = _children()
    with pytest.raises(ModelRaisedError, match=r"ValueError.*this model always fails"):
        ptconvert.convert(
            weights, "pt2", tmp_path / "m.pt2", model=f"{spec}:failing", inputs=["x:2x8:float32"]
        )
    assert not (tmp_path / "m.pt2").exists()
    assert _calls(log) == [(2, "torch.float32")]  # run once, after export failed
    assert _children() == before  # the interpreter started for the check is gone


def test_batch_sizes_choose_the_sizes_compared(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import run_cli

    args = [str(samples["mlp_zip"]), "--to", "pt2", "--model", "fixtures.models:MLP"]
    args += ["--input", "x:2x8:float32", "--batch-sizes", "4,6"]
    code, report, _ = run_cli([*args, "--dynamic-batch", "-o", str(tmp_path / "d.pt2")], capsys)
    assert code == 0, report
    assert [s["batch"] for s in report["parity"]["sizes"]] == [4, 6]
    assert not any("would take about" in n for n in report["notes"])
    code, report, _ = run_cli([*args, "-o", str(tmp_path / "s.pt2")], capsys)  # a static batch
    assert code == 0, report
    assert [s["batch"] for s in report["parity"]["sizes"]] == [2]
    assert any("not at --batch-sizes" in n for n in report["notes"]), report["notes"]
    with pytest.raises(ptconvert.UsageError, match="batch_sizes"):
        ptconvert.convert(samples["mlp_zip"], "pt2", tmp_path / "x.pt2", batch_sizes=[0])


EDGES = '''
import torch
from torch import nn


class Capped(nn.Module):
    """Takes at most 4 rows (a buffer of one row per batch item): eager fails at 5."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.register_buffer("rows", torch.randn(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + self.rows[: x.shape[0]]


class Lazy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.LazyLinear(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def capped() -> nn.Module:
    return Capped()


def lazy() -> nn.Module:
    return Lazy()
'''


def test_a_model_that_runs_for_a_few_batch_sizes_converts_with_that_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Eager itself fails at the default sizes past 4: the range check says which sizes hold
    before they are compared, not "the model raised"."""
    from tests.conftest import run_cli

    spec, weights = _factory(tmp_path, EDGES, "capped")
    args = [str(weights), "--to", "pt2", "--model", f"{spec}:capped", "--dynamic-batch"]
    args += ["--input", "x:2x8:float32", "-o", str(tmp_path / "c.pt2")]
    code, report, _ = run_cli(args, capsys)
    assert code == 0, report
    assert [s["batch"] for s in report["parity"]["sizes"]] == [1, 2, 3]
    assert report["dynamic_range"]["x dim 0"].startswith("batch 2–4")
    code, report, _ = run_cli([*args, "--batch-sizes", "2,6", "--force"], capsys)
    assert code == 0, report
    assert [s["batch"] for s in report["parity"]["sizes"]] == [2]
    assert any("--batch-sizes [6] left out" in n for n in report["notes"]), report["notes"]


def test_lazy_modules_are_settled_before_capture(tmp_path: Path) -> None:
    spec, weights = _factory(tmp_path, EDGES, "lazy", call=True)
    report = ptconvert.convert(
        weights, "torchscript", tmp_path / "l.ts", model=f"{spec}:lazy", inputs=["x:2x8:float32"]
    )
    assert report.check == "parity"
    assert any("lazy modules" in n for n in report.notes), report.notes
    scripted = torch.jit.load(tmp_path / "l.ts")
    weights_back = torch.load(weights, weights_only=True)
    x = torch.randn(3, 8)
    torch.testing.assert_close(
        scripted(x), x @ weights_back["fc.weight"].T + weights_back["fc.bias"]
    )


UNSCRIPTABLE = """
import torch
from torch import nn


class Unscriptable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, **options: object) -> torch.Tensor:
        return self.fc(x)
"""


def test_a_failed_capture_without_example_inputs_says_what_to_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No inputs to run the model on: the capture's own message, not the model's first run."""
    import importlib

    (tmp_path / "unscriptable_net.py").write_text(UNSCRIPTABLE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("unscriptable_net")
    torch.save(module.Unscriptable().eval(), tmp_path / "full.pt")
    with pytest.raises(ptconvert.MissingRequirementError, match="needs example inputs"):
        ptconvert.convert(tmp_path / "full.pt", "torchscript", tmp_path / "o.ts", trust=True)


def test_a_batch_range_at_its_minimum_is_compared_at_every_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--dynamic x:0:2:8`` on an example of batch 2: the trace is taken at a batch inside
    the range, and the sizes compared are still each their own size."""
    report, log = _convert_counted(tmp_path, monkeypatch, dynamic=["x:0:2:8"])
    assert report.parity is not None and report.parity.status == "pass"
    assert any("traced at x dim 0 = 5" in n for n in report.notes), report.notes
    compared = [s.batch for s in report.parity.sizes]
    fp32 = {n for n, dtype in _calls(log) if dtype == "torch.float32"}
    assert set(compared) <= fp32 and len(compared) > 2, (compared, fp32)


def test_a_slow_models_probes_get_what_the_comparisons_left_of_the_share() -> None:
    """A 204 M decoder's check took 60 % of its steps: the optional probes (each dim's top)
    had 20 s of their own after the comparisons. They now share the steps' share with the
    comparisons; only a model whose call is fast keeps the 20 s."""
    import time

    from ptconvert.verify.judging import judge_program

    share = program_check.check_seconds(10.0)
    assert program_check.optional_seconds(0.4, 10.0) == share
    assert program_check.optional_seconds(0.001, 10.0) == program_check.PROBE_SECONDS
    assert program_check.optional_seconds(None, 100.0) == 100.0 * program_check.CHECK_SHARE
    # between the two, in proportion: no step where a call timed under load lands either side
    assert program_check.optional_seconds(0.1, 1.0) == program_check.PROBE_SECONDS / 2

    class Slow(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            time.sleep(0.05)
            return x * 2

    batch = torch.export.Dim("batch", min=1)
    ep = torch.export.export(Slow(), (), {"x": torch.randn(2, 3)}, dynamic_shapes={"x": {0: batch}})
    tops = {}
    # eager (and its fp64 copy) sleeps: the comparisons at 1, 2, 3 take about 0.35 s, the
    # probes every dim always gets (1 and 5) 0.2 s; 0.45 s used to leave the top its time
    for seconds in (0.45, None):
        judged = judge_program(
            Slow(),
            ep.module(),
            lambda b: {"x": torch.randn(b, 3)},
            [1, 2, 3],
            ep,
            lambda: {"x": torch.randn(2, 3)},
            seconds=seconds,
        )
        assert judged.ranges is not None
        (r,) = judged.ranges.dims
        tops[seconds] = r.text
    assert tops[0.45] == "batch 1 or more (checked up to 5)", tops  # its top, 32, never ran
    assert tops[None] == "batch 1 or more (checked up to 32)", tops  # the budget's top


def test_the_sizes_a_user_asks_for_spend_none_of_the_probes_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--batch-sizes``: the comparisons at the user's sizes are not the check's optional
    work; the probes get the whole share after them (``shared=False``)."""
    import time

    from ptconvert.verify import ranges
    from ptconvert.verify.judging import judge_program

    class Slow(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            time.sleep(0.05)
            return x * 2

    batch = torch.export.Dim("batch", min=1)
    ep = torch.export.export(Slow(), (), {"x": torch.randn(2, 3)}, dynamic_shapes={"x": {0: batch}})
    given: dict[bool, float] = {}
    real = ranges.check_program

    def seen(*args: Any, **kwargs: Any) -> Any:
        given[shared] = kwargs["seconds"]
        return real(*args, **kwargs)

    monkeypatch.setattr(ranges, "check_program", seen)
    for shared in (True, False):
        judge_program(
            Slow(),
            ep.module(),
            lambda b: {"x": torch.randn(b, 3)},
            [1, 2, 3],  # eager and its fp64 copy at each, and once more: 0.35 s of sleep
            ep,
            lambda: {"x": torch.randn(2, 3)},
            seconds=5.0,
            shared=shared,
        )
    assert given[True] <= 5.0 - 0.3, given  # the comparisons spent their part
    assert given[False] > 5.0 - 0.1, given  # the user's sizes spent none
