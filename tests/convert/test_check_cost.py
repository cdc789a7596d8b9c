"""What the check of a written program costs beside the conversion: its fresh interpreter starts
before the converting process imports torch (both imports overlap), and ends as soon as its
verdict is written; what it proves is unchanged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ptconvert.convert.state import RunState
from ptconvert.errors import VerificationError
from ptconvert.verify.fresh_load import FreshLoad

# the conversion in a process of its own (this one imported torch already): every process it
# starts is noted with whether torch was imported in the converting process at that moment
SPY = """
import subprocess, sys
import ptconvert

started = []
real = subprocess.Popen


class Spy(real):
    def __init__(self, args, *rest, **kwargs):
        started.append(("torch" in sys.modules, " ".join(map(str, args))[-80:]))
        super().__init__(args, *rest, **kwargs)


subprocess.Popen = Spy
report = ptconvert.convert(
    sys.argv[1], "pt2", sys.argv[2], model="fixtures.models:MLP", inputs=["x:2x8:float32"],
    dynamic_batch=True, cache=False,
)
fresh = [imported for imported, args in started if "the file, loaded" in args]
print(report.check, report.parity.status, fresh)
"""


def test_the_fresh_interpreter_starts_before_the_conversion_imports_torch(
    samples: dict[str, Path], tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SPY, str(samples["mlp_zip"]), str(tmp_path / "m.pt2")],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent.parent.parent,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # one fresh interpreter, started while torch was not yet imported here
    assert done.stdout.split()[-3:] == ["parity", "pass", "[False]"], done.stdout


def _state(tmp_path: Path) -> RunState:
    return RunState(tmp_path / "src.pt", "pt")


def test_the_fresh_interpreter_ends_once_its_outputs_are_written(tmp_path: Path) -> None:
    """Its outputs come back; its own teardown (atexit handlers, torch's modules unloaded)
    never runs: nothing waits for it."""
    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(3, 2).eval(), (torch.randn(1, 3),)), path)
    marker = tmp_path / "torn-down"
    fresh = FreshLoad("pt2")
    try:
        fresh._load = (
            f"import atexit\natexit.register(lambda: open({str(marker)!r}, 'w').close())\n"
            + fresh._load
        )
        fresh.load(path, run={"input": torch.ones(1, 3)}, positional=["input"])
        outputs = fresh.finish(_state(tmp_path).src)
    finally:
        fresh.stop()
    assert outputs is not None and outputs[0].shape == (1, 2)
    assert not marker.exists()


def test_a_file_that_does_not_load_in_the_fresh_interpreter_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "broken.pt2"
    path.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: no program in it
    fresh = FreshLoad("pt2")
    try:
        fresh.load(path, run={"x": torch.ones(1, 3)})
        with pytest.raises(VerificationError, match="does not load in a fresh Python process"):
            fresh.finish(_state(tmp_path).src)
    finally:
        fresh.stop()


@pytest.mark.parametrize("case", ["same", "close", "apart", "nan", "empty"])
def test_the_cheaper_leaf_comparison_gives_torchs_numbers(case: str) -> None:
    """Equal bits skip the arithmetic, isclose runs only above atol: the numbers reported are
    still those of the plain formulas."""
    from ptconvert.verify.parity import TOLERANCES, _compare_one

    torch.manual_seed(0)
    a = torch.randn(0 if case == "empty" else 3000)
    b = {
        "same": a.clone(),
        "close": a + 1e-6 * torch.randn_like(a),
        "apart": a + 1e-3 * torch.randn_like(a),
        "nan": a.clone(),
        "empty": a.clone(),
    }[case]
    if case == "nan":
        a[5], b[5], b[7] = float("nan"), float("nan"), b[7] + 1
    got = _compare_one("out", a, b, None, TOLERANCES, None, None)
    diff = (a.double() - b.double()).abs()
    close = torch.isclose(a, b, rtol=1e-4, atol=1e-4, equal_nan=True)
    assert got.status == ("pass" if bool(close.all()) else "fail_accuracy")
    assert got.outside_tolerance == pytest.approx(
        float((~close).float().mean()) if a.numel() else 0
    )
    if case not in ("nan", "empty"):
        assert got.max_abs_error == pytest.approx(float(diff.max()))
        rel = diff / a.double().abs().clamp_min(1e-12)
        assert got.max_rel_error == pytest.approx(float(rel.max()))
        cosine = torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0, eps=1e-12)
        assert got.cosine == pytest.approx(float(cosine), abs=1e-12)


def test_a_size_judged_above_the_cost_bound_is_the_top_and_is_not_probed_again() -> None:
    """Batch 7 was compared and passed, above the 4 the budget allows a probe: it is the top
    checked, and no other size above the example runs again for it."""
    from ptconvert.verify.dims import DynamicDim
    from ptconvert.verify.probes import shapes_of
    from ptconvert.verify.ranges import check_ranges, runs

    dim = DynamicDim("x", 0, "s0", "s0", 2, None, symbol_min=2, rank=2)
    calls: list[int] = []

    def program(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return x

    known = {shapes_of({"x": torch.zeros(b, 8)}): None for b in (1, 2, 3, 7)}
    known[shapes_of({"x": torch.zeros(9, 3)})] = None  # another shape: not along the dim
    report = check_ranges([dim], {"x": torch.zeros(2, 8)}, runs(program), budget=2, known=known)
    (r,) = report.dims
    assert r.status == "holds" and r.checked_high == 7 and "checked up to 7" in r.text, r
    assert max(calls, default=0) < 7 and 4 not in calls, calls  # the old top, 4, never ran


def test_the_cores_come_back_between_sizes_once_the_fresh_interpreter_ended() -> None:
    """While the fresh interpreter runs, this process computes on the threads it leaves; from
    the first size compared after it ended, on all of them again (never within a size: eager's
    two runs of the determinism check share one thread count)."""
    from ptconvert.verify.parity import compare

    before = torch.get_num_threads()
    torch.set_num_threads(4)
    seen: list[int] = []

    def model(x: torch.Tensor) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return x * 2

    fresh = FreshLoad("pt2")  # a quarter of 4 threads: 1
    try:
        with fresh.sharing_cores():
            make = lambda b: {"x": torch.ones(b, 2)}  # noqa: E731
            compare(model, model, make, [1], determinism="done")
            fresh._proc.kill()
            fresh._proc.wait()
            compare(model, model, make, [2, 3], determinism="once")
        after = torch.get_num_threads()
    finally:
        fresh.stop()
        torch.set_num_threads(before)
    assert seen == [3, 3, 4, 4, 4, 4, 4] and after == 4, seen


def test_a_pt2_of_any_size_starts_its_fresh_interpreter_with_the_route() -> None:
    """The save writes the weights from where they lie (no copy of the largest tensor for the
    interpreter's torch to add to): a pt2's check starts it with the route at every size;
    TorchScript's above PREWARM_BYTES once its file is written; never unverified."""
    from ptconvert.convert.program_check import PREWARM_BYTES, started_early
    from ptconvert.options import Options

    big = 10 * PREWARM_BYTES
    fresh = started_early(Options(), "pt2", big)
    try:
        assert isinstance(fresh, FreshLoad)
    finally:
        if fresh is not None:
            fresh.stop()
    assert started_early(Options(), "torchscript", big) is None
    assert started_early(Options(verify=False), "pt2", big) is None
