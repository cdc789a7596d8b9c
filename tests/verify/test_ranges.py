"""Dynamic ranges: what torch guarantees, what really runs, in words, on real exported programs
(torch.export → save → load, as the conversion writes them)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.export import Dim

from ptconvert.verify.dims import DynamicDim, describe, dynamic_dims
from ptconvert.verify.parity import compare
from ptconvert.verify.probes import example_sizes, probe_sizes, probed_at_one, resize
from ptconvert.verify.range_findings import DimRange, RangeReport
from ptconvert.verify.ranges import check_ranges, runs
from ptconvert.verify.shape_guards import shape_guards

DYN = Dim.DYNAMIC


class PNetLike(nn.Module):
    """MTCNN's proposal net: conv3 → maxpool2 (ceil) → conv3 → conv3 → 1×1 heads. At height 12
    the last feature map is 1 high, a size torch.export's trace assumed away."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 10, 3), nn.PReLU(10)
        self.pool1 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv2, self.prelu2 = nn.Conv2d(10, 16, 3), nn.PReLU(16)
        self.conv3, self.prelu3 = nn.Conv2d(16, 32, 3), nn.PReLU(32)
        self.conv4_1, self.conv4_2 = nn.Conv2d(32, 2, 1), nn.Conv2d(32, 4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.prelu3(self.conv3(self.prelu2(self.conv2(x))))
        return self.conv4_2(x), torch.softmax(self.conv4_1(x), dim=1)


class SkipUp(nn.Module):
    """A decoder step: a stride-2 transposed conv (length 2n+1) added to a skip connection."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose1d(4, 4, 3, stride=2)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.up(x) + skip


class Pairs(nn.Module):
    """Sums neighbouring pairs: a view that only even lengths (of 4 or more) survive."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], -1, 2).sum(-1)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Tied(nn.Module):
    """x's length must be half of y's (rounded up): a relation torch keeps as a guard only."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y[:, ::2]


def _seeded(model: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    for p in model.parameters():
        nn.init.normal_(p, std=0.3)
    return model.eval()


def _exported(
    tmp: Path, model: nn.Module, example: dict[str, Any], shapes: dict[str, Any]
) -> tuple[Any, Any]:
    """torch.export → save → load; (program, a call by name, positional like forward)."""
    ep = torch.export.export(model, tuple(example.values()), dynamic_shapes=tuple(shapes.values()))
    path = tmp / f"{type(model).__name__}.pt2"
    torch.export.save(ep, path)
    loaded = torch.export.load(path)
    program = loaded.module()
    names = list(example)
    return loaded, lambda **kw: program(*[kw[n] for n in names])


def _runs_at(call: Any, example: dict[str, Any], sizes: dict[tuple[str, int], int]) -> bool:
    try:
        call(**resize(example, sizes))
    except Exception:
        return False
    return True


def _assert_runs_at_both_ends(
    call: Any, example: dict[str, Any], r: DimRange, dims: list[DynamicDim]
) -> None:
    """The range a DimRange states runs at its low end and at its high end (or, unbounded or
    beyond the cost budget, at the largest size checked)."""
    assert r.low is not None and r.checked_high is not None
    for size in (r.low, r.checked_high):
        point = {r.dim.key: size}
        value = r.dim.value_of(size)
        assert value is not None
        for other in dims:  # dims of the same symbol move with it
            if other.key in r.dim.shared:
                point[other.key] = other.size_at(value)
        assert _runs_at(call, example, point), (r.text, point)
    if r.high is not None and r.high != r.checked_high:
        assert "(checked up to" in r.text  # a top beyond the budget is never claimed as run


def _check(
    ep: Any, call: Any, reference: nn.Module | None, example: dict[str, Any], **kw: Any
) -> tuple[RangeReport, list[DynamicDim]]:
    dims = dynamic_dims(ep)
    judge = runs(call) if reference is None else functools.partial(compare, reference, call)
    return check_ranges(dims, example, judge, guards=shape_guards(ep), **kw), dims


@pytest.fixture(scope="module")
def pnet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, nn.Module, dict[str, Any]]:
    model = _seeded(PNetLike())
    example = {"x": torch.randn(2, 3, 32, 32)}
    side = DYN(min=12, max=2048)  # --dynamic x:2:12:2048 --dynamic x:3:12:2048 --dynamic-batch
    ep, call = _exported(
        tmp_path_factory.mktemp("pnet"), model, example, {"x": {0: DYN, 2: side, 3: side}}
    )
    return ep, call, model, example


def test_dynamic_dims_read_the_guarantee_without_sympy_words(pnet: Any) -> None:
    ep, *_ = pnet
    dims = {d.axis: d for d in dynamic_dims(ep)}
    assert sorted(dims) == [0, 2, 3]
    assert (dims[0].min, dims[0].max) == (2, None)
    assert (dims[2].min, dims[2].max) == (12, 2048)
    assert dims[2].shared == () and dims[2].symbol != dims[3].symbol
    words = [describe(dims[a]) for a in (0, 2, 3)]
    assert words == ["batch 2 or more", "height 12–2048", "width 12–2048"]
    assert not any("int_oo" in w or "VR[" in w for w in words)


def test_the_face_detector_fails_at_its_low_end_and_the_range_narrows(pnet: Any) -> None:
    ep, call, model, example = pnet
    report, dims = _check(ep, call, model, example, budget=64)  # 64 × 32: the max 2048 is run too
    by_axis = {r.dim.axis: r for r in report.dims}
    height, width = by_axis[2], by_axis[3]
    assert report.status == "narrowed"
    assert height.status == "narrowed" and (height.low, height.high) == (13, 2048)
    assert height.checked_high == 2048
    assert height.text.startswith("runs for height 13–2048; fails at 12: Guard failed")
    assert [f.size for f in height.failed if f.ran] == [12]
    assert width.text.startswith("runs for width 13–2048; fails at 12")
    assert by_axis[0].status == "holds" and by_axis[0].text.startswith("batch 2 or more")
    assert report.joint is None  # 13 × 13 at batch 2 together runs as well
    for r in report.dims:
        _assert_runs_at_both_ends(call, example, r, dims)
    with pytest.raises(AssertionError, match="Guard failed"):  # what the user hit
        call(**resize(example, {("x", 2): 12, ("x", 3): 12}))


def test_probing_alone_finds_the_edge_when_no_guards_are_readable(pnet: Any) -> None:
    ep, call, _model, example = pnet
    dims = [d for d in dynamic_dims(ep) if d.axis == 2]
    report = check_ranges(dims, example, runs(call), guards=None)
    (height,) = report.dims
    assert (height.low, height.high) == (13, 2048)
    # the default budget stops at 16 × 32: the guaranteed top is said not to have run
    assert height.checked_high == 512 and "(checked up to 512)" in height.text
    assert "fails at 12" in height.text
    _assert_runs_at_both_ends(call, example, height, dims)


def test_a_derived_dim_says_odd_sizes_only(tmp_path: Path) -> None:
    model = _seeded(SkipUp())
    example = {"x": torch.randn(2, 4, 6), "skip": torch.randn(2, 4, 13)}
    ep, call = _exported(tmp_path, model, example, {"x": {2: DYN}, "skip": {2: DYN}})
    by_input = {d.input: d for d in dynamic_dims(ep)}
    skip, x = by_input["skip"], by_input["x"]
    assert (skip.scale, skip.offset, skip.min, skip.max) == (2, 1, 5, None)
    assert skip.shared == (("x", 2),) and x.shared == (("skip", 2),)
    assert describe(skip) == "length 5 or more, odd sizes only"
    assert describe(skip, list(by_input.values())) == (
        "length 5 or more, odd sizes only (always 2 × x dim 2 + 1)"
    )
    report, dims = _check(ep, call, model, example)
    assert report.status == "pass"
    texts = {r.dim.input: r.text for r in report.dims}
    assert texts["skip"] == "length 5 or more, odd sizes only (checked up to 193)"
    assert texts["x"] == "length 2 or more (checked up to 96)"
    for r in report.dims:
        _assert_runs_at_both_ends(call, example, r, dims)


def test_a_view_into_pairs_runs_at_even_sizes_only(tmp_path: Path) -> None:
    model = Pairs()
    example = {"x": torch.randn(2, 3, 8)}
    ep, call = _exported(tmp_path, model, example, {"x": {2: DYN}})
    (dim,) = dynamic_dims(ep)
    assert describe(dim) == "length 2 or more"  # what torch guarantees …
    report, dims = _check(ep, call, model, example)  # … the eager model itself fails at odd sizes
    (r,) = report.dims
    assert r.status == "narrowed" and (r.low, r.high, r.modulus) == (4, None, 2)
    assert r.text.startswith("runs for length 4 or more, even sizes only (checked up to 128)")
    assert "fails at 2, " in r.text and "Guard failed" in r.text
    _assert_runs_at_both_ends(call, example, r, dims)
    assert not _runs_at(call, example, {("x", 2): 2})
    assert not _runs_at(call, example, {("x", 2): 9})


def test_a_dynamic_batch_mlp_holds_its_guaranteed_range(tmp_path: Path) -> None:
    model = _seeded(MLP())
    example = {"x": torch.randn(2, 8)}
    ep, call = _exported(tmp_path, model, example, {"x": {0: DYN}})
    (dim,) = dynamic_dims(ep)
    assert describe(dim) == "batch 2 or more"
    report, dims = _check(ep, call, model, example)
    (r,) = report.dims
    assert report.status == "pass" and r.status == "holds"
    assert (r.low, r.high, r.checked_high) == (2, None, 32)
    assert r.text == "batch 2 or more (checked up to 32); also runs at 1"
    assert r.also == [1]
    assert json.loads(json.dumps(report.to_dict()))["dims"][0]["dim"]["min"] == 2  # --json
    _assert_runs_at_both_ends(call, example, r, dims)


def test_a_relation_kept_only_as_a_guard_is_named(tmp_path: Path) -> None:
    example = {"x": torch.randn(3, 5), "y": torch.randn(3, 9)}
    ep, call = _exported(tmp_path, Tied(), example, {"x": {1: DYN}, "y": {1: DYN}})
    report, _dims = _check(ep, call, None, example, try_one=False)
    texts = {r.dim.input: r.text for r in report.dims}
    assert "a guard ties it to x dim 1" in texts["y"]
    assert "a guard ties it to y dim 1" in texts["x"]


def test_probe_points_share_a_symbol_and_bound_the_cost() -> None:
    x = DynamicDim("x", 2, "s0", "s0", 2, None, shared=(("skip", 2),), rank=3)
    skip = DynamicDim(
        "skip", 2, "2*s0 + 1", "s0", 5, None, 2, 1, 2, None, shared=(("x", 2),), rank=3
    )
    batch = DynamicDim("x", 0, "s1", "s1", 2, 8, symbol_min=2, symbol_max=8, rank=3)
    points = probe_sizes([x, skip, batch], {("x", 2): 6, ("skip", 2): 13, ("x", 0): 2}, budget=4)
    lengths = [p for p in points if ("x", 2) in p and len(p) == 2]
    assert [p[("x", 2)] for p in lengths] == [2, 7, 24]  # min, odd middle, 4 × example 6
    assert all(p[("skip", 2)] == 2 * p[("x", 2)] + 1 for p in lengths)
    batches = [p[("x", 0)] for p in points if len(p) == 1]
    assert batches == [2, 5, 8]  # a finite max within the budget is run as it is
    assert points[-1] == {("x", 2): 2, ("skip", 2): 5, ("x", 0): 2}  # every dim at its minimum


def test_words_for_steps_and_plain_sizes() -> None:
    plain = DynamicDim("t", 1, "s0", "s0", 1, 64, rank=2)
    assert describe(plain) == "any size 1–64"
    eights = DynamicDim("img", 2, "8*s0", "s0", 16, 512, 8, 0, 2, 64, rank=4)
    assert describe(eights) == "height 16–512, multiples of 8 only"
    odd8 = DynamicDim("img", 3, "8*s0 + 3", "s0", 11, None, 8, 3, 1, None, rank=4)
    assert describe(odd8) == "width 11 or more, sizes of the form 8k+3 only"
    ids = DynamicDim("input_ids", 1, "s0", "s0", 2, 4096, rank=2, integer=True)
    assert describe(ids) == "sequence length 2–4096"


def test_resize_repeats_or_cuts_along_an_axis() -> None:
    t = torch.arange(12.0).reshape(1, 3, 4)
    out = resize({"x": t, "flag": True}, {("x", 2): 10, ("x", 1): 2})
    assert out["flag"] is True and out["x"].shape == (1, 2, 10)
    assert torch.equal(out["x"][0, :, :4], t[0, :2]) and torch.equal(
        out["x"][0, :, 8:], t[0, :2, :2]
    )
    same = {"x": t}
    assert resize(same, {("x", 0): 1})["x"] is t
    assert example_sizes([DynamicDim("x", 2, "s0", "s0", 2, None)], same) == {("x", 2): 4}


def test_probing_narrows_both_ends_in_rounds_and_says_what_is_known() -> None:
    """No guards to read: a program that runs for lengths 40–700 only, checked on 2–1000."""
    dim = DynamicDim("x", 1, "s0", "s0", 2, 1000, symbol_min=2, symbol_max=1000, rank=2)
    calls: list[int] = []

    def program(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[1])
        if not 40 <= x.shape[1] <= 700:
            raise RuntimeError(f"length {x.shape[1]} out of range")
        return x

    example = {"x": torch.zeros(1, 64)}
    report = check_ranges([dim], example, runs(program), rounds=3, try_one=False)
    (r,) = report.dims
    assert report.status == "narrowed" and r.status == "narrowed"
    assert r.low is not None and r.high is not None and 40 <= r.low < 48 and 600 < r.high <= 700
    below = max(f.size for f in r.failed if f.size < r.low)
    above = min(f.size for f in r.failed if f.size > r.high)
    assert r.text.startswith(f"runs for any size {r.low}–{r.high}; fails at {below}, {above} (and ")
    assert "RuntimeError: length" in r.text
    assert report.probes == len(calls) <= 3 + 3 * 2 * 6  # first batch, 3 rounds of 2 ends


def test_sizes_judged_already_are_not_run_again() -> None:
    """The conversion's own comparison ran some sizes: their verdicts stand, the rest run."""
    from ptconvert.verify.probes import shapes_of

    dim = DynamicDim("x", 0, "s0", "s0", 2, None, symbol_min=2, rank=2)
    calls: list[int] = []

    def program(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return x

    example = {"x": torch.zeros(2, 8)}
    first = check_ranges([dim], example, runs(program), budget=4)
    ran = sorted(set(calls))
    assert ran == [1, 2, 5, 8] and first.status == "pass"  # the ends, a middle, and 1
    calls.clear()
    known = {
        shapes_of({"x": torch.zeros(1, 8)}): "fail_to_run: size 1 refused",
        shapes_of({"x": torch.zeros(2, 8)}): None,
        shapes_of({"x": torch.zeros(5, 8)}): None,
    }
    report = check_ranges([dim], example, runs(program), budget=4, known=known)
    assert sorted(calls) == [8] and report.probes == 1  # only the size not judged before
    (r,) = report.dims
    assert r.status == "holds" and 1 not in r.also, r
    assert "size 1 refused" in r.text


def test_sizes_where_the_program_runs_wrong_are_told_from_sizes_it_refuses() -> None:
    """A branch on the batch size that export kept one side of: at 1 the program runs and
    computes the other side's numbers (wrong); above 20 it refuses (not wrong: it says so)."""
    dim = DynamicDim("x", 0, "s0", "s0", 2, None, symbol_min=2, rank=2)

    def reference(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def program(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 20:
            raise RuntimeError("refused")
        return x * 3 if x.shape[0] == 1 else x * 2

    judge = functools.partial(compare, reference, program)
    report = check_ranges([dim], {"x": torch.ones(2, 3)}, judge)
    (r,) = report.dims
    assert r.wrong == [1] and r.also == [] and "not at 1: fail_accuracy" in r.text
    assert r.status == "narrowed" and r.high is not None and r.high <= 20  # refused above


def test_only_plain_dims_from_torchs_floor_of_two_are_run_at_one() -> None:
    batch = DynamicDim("x", 0, "s1", "s1", 2, None, symbol_min=2, rank=3)
    length = DynamicDim("x", 2, "s0", "s0", 2, None, symbol_min=2, rank=3)
    skip = DynamicDim("skip", 2, "2*s0 + 1", "s0", 5, None, 2, 1, 2, None, rank=3)
    high = DynamicDim("y", 1, "s2", "s2", 13, None, symbol_min=13, rank=4)
    assert probed_at_one([batch, length, skip, high]) == [batch]


def test_every_dim_at_its_minimum_together_is_checked() -> None:
    batch = DynamicDim("x", 0, "s0", "s0", 2, None, symbol_min=2, rank=2)
    length = DynamicDim("x", 1, "s1", "s1", 2, None, symbol_min=2, rank=2)

    def program(x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape) == (2, 2):
            raise RuntimeError("too small in both")
        return x

    report = check_ranges([batch, length], {"x": torch.zeros(4, 8)}, runs(program))
    assert [r.status for r in report.dims] == ["holds", "holds"]
    assert report.status == "narrowed" and report.joint is not None
    assert "together" in report.joint and "too small in both" in report.joint


PNET_FILE = """
import torch
from tests.verify.test_ranges import PNetLike, _seeded


def make():
    return _seeded(PNetLike())
"""


@pytest.fixture
def pnet_weights(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "pnet_factory.py").write_text(PNET_FILE)
    torch.save(_seeded(PNetLike()).state_dict(), tmp_path / "pnet.pt")
    return tmp_path / "pnet.pt", f"{tmp_path / 'pnet_factory.py'}:make"


# slow (PNet traced and checked up to 2048 × 2048): a conversion's ranges are reported by default
# in test_a_branch_on_the_batch_size_narrows_the_exported_range_and_says_so, PNet's narrowed
# range by test_the_face_detector_fails_at_its_low_end_and_the_range_narrows and, through the
# CLI, by test_verify_checks_every_dynamic_dim_of_a_hand_exported_program
@pytest.mark.slow
def test_conversion_reports_the_range_that_holds_for_every_dim(
    pnet_weights: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--dynamic x:2:12:2048 from a 12×12 example: the program is traced inside the range and
    the report names the sizes that run (not 12), each checked at its ends."""
    from tests.conftest import run_cli

    weights, factory = pnet_weights
    out = tmp_path / "pnet.pt2"
    args = [str(weights), "--to", "pt2", "--model", factory, "--input", "x:1x3x12x12:float32"]
    args += ["--dynamic-batch", "--dynamic", "x:2:12:2048", "--dynamic", "x:3:12:2048"]
    code, report, _ = run_cli([*args, "-o", str(out)], capsys)
    assert code == 0, report
    height = report["dynamic_range"]["x dim 2"]
    assert "13–2048" in height and "fails at 12" in height and "s7" not in height, height
    assert any("x dim 2: " in a for a in report["interface"]["accepts"])
    program = torch.export.load(out).module()
    program(torch.randn(1, 3, 13, 13))
    program(torch.randn(2, 3, 200, 13))
    with pytest.raises(AssertionError, match="Guard failed"):
        program(torch.randn(1, 3, 12, 12))


def test_verify_checks_every_dynamic_dim_of_a_hand_exported_program(
    pnet: Any, pnet_weights: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import run_cli

    ep, _call, _model, _example = pnet
    torch.export.save(ep, tmp_path / "hand.pt2")
    weights, factory = pnet_weights
    args = ["verify", str(weights), str(tmp_path / "hand.pt2"), "--model", factory]
    code, report, _ = run_cli([*args, "--input", "x:2x3x32x32:float32"], capsys)
    assert code == 0, report
    assert "fails at 12" in report["ranges"]["x dim 2"], report["ranges"]
    assert "13–2048" in report["ranges"]["x dim 3"], report["ranges"]


def test_the_optional_probes_stop_when_the_checks_time_is_spent() -> None:
    """Swin → ONNX and SAM2 → pt2 --dynamic-batch checks never finished: each dim's top, the
    guards' edges and the narrowing rounds ran whatever they cost. With ``seconds`` spent, each
    dim runs its smallest size and a middle one only, the top is said as "checked up to" the
    largest that ran, and each probe is a progress step naming its dim and size."""
    import contextlib

    from ptconvert import progress

    dim = DynamicDim("x", 1, "s0", "s0", 2, None, symbol_min=2, rank=2)
    calls: list[int] = []

    def program(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[1])
        return x

    shown: list[str] = []

    class Shown:
        @contextlib.contextmanager
        def step(self, name: str) -> Any:
            shown.append(name)
            yield

    progress.set_reporter(Shown())  # type: ignore[arg-type]
    try:
        report = check_ranges([dim], {"x": torch.zeros(1, 64)}, runs(program), seconds=0)
    finally:
        progress.set_reporter(None)
    assert sorted(calls) == [1, 2, 45], calls  # 1, the smallest and an odd middle, not 1024
    (r,) = report.dims
    assert r.status == "holds" and r.high is None and "(checked up to 45)" in r.text, r
    assert shown == [f"checking x dim 1 at {n}" for n in (2, 45, 1)], shown
    calls.clear()
    check_ranges([dim], {"x": torch.zeros(1, 64)}, runs(program))
    assert 1024 in calls  # no time limit: the top as before


def test_verify_places_its_probes_by_the_programs_guards(tmp_path: Path) -> None:
    """Issue 43: ``verify`` dropped the program's shape guards whenever it renamed inputs (it
    always does), and its probes then found "any size 14 or more" for a dim whose example, 6,
    ran: the guards read under the reference's names say even sizes from 4."""
    import ptconvert

    torch.save({}, tmp_path / "ref.pt")
    dims = {"x": {0: Dim.DYNAMIC, 2: Dim.DYNAMIC}}
    ep = torch.export.export(Pairs(), (torch.randn(2, 3, 6),), dynamic_shapes=dims)
    torch.export.save(ep, tmp_path / "cand.pt2")
    report = ptconvert.verify(
        tmp_path / "ref.pt",
        tmp_path / "cand.pt2",
        model="tests.verify.test_ranges:Pairs",
        inputs=["x:2x3x6:float32"],
    )
    assert report.status == "pass"
    assert report.ranges["x dim 2"].startswith("runs for length 4 or more, even sizes only")


def test_a_failing_end_is_narrowed_even_when_the_checks_time_is_spent() -> None:
    """The bounds a program is exported again with come from the narrowing: with the optional
    probes' time spent (a slow model), a range that fails below 40 is still narrowed to about
    40, not left at the middle size that passed (which would refuse 40–44 that run)."""
    dim = DynamicDim("x", 1, "s0", "s0", 2, 1000, symbol_min=2, symbol_max=1000, rank=2)

    def program(x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] < 40:
            raise RuntimeError(f"length {x.shape[1]} too short")
        return x

    report = check_ranges([dim], {"x": torch.zeros(1, 64)}, runs(program), seconds=0, rounds=3)
    (r,) = report.dims
    assert r.status == "narrowed" and r.low is not None and 40 <= r.low < 45, r
    assert "(checked up to" in r.text  # the top, optional, never ran


def test_a_probe_is_expected_to_cost_a_fixed_part_and_a_part_per_element() -> None:
    from ptconvert.verify.ranges import _ProbeCost

    cost = _ProbeCost()
    assert cost.expected(1000) == 0.0  # nothing known: it runs
    cost.add(100, 0.2)
    assert cost.expected(1000) == pytest.approx(2.0)  # one probe: in proportion
    cost.add(1100, 0.3)  # an onnxruntime call's 0.19 s, 0.0001 s an element
    assert cost.expected(10_100) == pytest.approx(1.2)
    cost.add(50, 0.25)  # noise: never a negative cost per element
    assert cost.expected(10_100) == pytest.approx(0.3 + (0.3 - 0.25) / 1050 * 9000)
