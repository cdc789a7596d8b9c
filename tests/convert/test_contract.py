"""The artifact's contract holds where users call it: a conversion never exits 0 with an
artifact that returns wrong numbers for an input it accepts.

Every artifact is called in a fresh Python process by its own loader, with no environment
variable set (``AOTI_RUNTIME_CHECK_INPUTS`` removed): as a user calls it. AOTInductor compiles
native code (tens of seconds): those tests are marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from fixtures.models import BatchBranch, FixedTable, RowBroadcast, ThreadSums, seeded
from ptconvert.formats import FORMATS_BY_NAME
from tests.conftest import run_cli

# the artifact's own loader, in a new interpreter: its first output, or what it raised
_CALL_FRESH = """
import json, sys
import numpy as np
import torch
from torch.utils._pytree import tree_leaves
kind, path, data, dtype = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
x = np.asarray(data, dtype=dtype)
try:
    if kind == "onnx":
        import onnxruntime
        sess = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        out = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    else:
        prog = (
            torch._inductor.aoti_load_package(path)
            if kind == "aoti"
            else torch.export.load(path).module()
        )
        with torch.no_grad():
            out = tree_leaves(prog(torch.from_numpy(x)))[0].numpy()
    print(json.dumps({"out": np.asarray(out).tolist()}))
except Exception as exc:
    print(json.dumps({"raised": f"{type(exc).__name__}: {exc}"}))
"""


def call_fresh(kind: str, path: Path, x: torch.Tensor) -> dict[str, Any]:
    """``{"out": …}`` or ``{"raised": …}``: ``path`` called on ``x`` in a fresh process, without
    AOTI_RUNTIME_CHECK_INPUTS."""
    env = {k: v for k, v in os.environ.items() if k != "AOTI_RUNTIME_CHECK_INPUTS"}
    dtype = str(x.dtype).removeprefix("torch.")
    proc = subprocess.run(
        [sys.executable, "-c", _CALL_FRESH, kind, str(path), json.dumps(x.tolist()), dtype],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _checkpoint(tmp_path: Path, model: torch.nn.Module) -> Path:
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    return path


X = torch.randn(8, 8, generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("to", ["pt2", "onnx", pytest.param("aoti", marks=pytest.mark.slow)])
def test_a_branch_on_the_batch_size_is_never_wrong_where_the_artifact_runs(
    to: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The program runs at batch 1 and returns the other branch's numbers: a .pt2 and an AOTI
    package are exported again with batch ≥ 2 and refuse 1; ONNX has no minimum, so its
    conversion is refused or takes another route that is right where it runs (TorchScript's
    converter: a graph of the example's shapes, which onnxruntime holds to)."""
    model = seeded(BatchBranch())
    out = tmp_path / f"branch{FORMATS_BY_NAME[to].suffix}"
    args = ["--model", "fixtures.models:BatchBranch", "--input", "x:2x8:float32"]
    code, report, _ = run_cli(
        [str(_checkpoint(tmp_path, model)), "--to", to, *args, "--dynamic-batch", "-o", str(out)],
        capsys,
    )
    assert code in (0, 6), report
    if code == 6:  # refused: nothing written
        assert report["error"]["type"] == "VerificationError" and not out.exists()
        return
    refused = []
    for b in (1, 2, 3):
        got = call_fresh(to, out, X[:b])
        if "raised" in got:
            refused.append(b)
            continue
        torch.testing.assert_close(torch.tensor(got["out"]), model(X[:b]), rtol=1e-4, atol=1e-5)
    notes = report["notes"]
    if to == "onnx":
        assert 2 not in refused  # the example's batch runs
        # the refused program's notes went with it (a batch dim named in a file not written)
        assert not any("dynamic dims named" in n for n in notes), notes
    else:
        assert refused == [1]
        assert any("x dim 0 bounded to 2 or more" in n for n in report["notes"]), report["notes"]
        (accepts,) = report["interface"]["accepts"]
        assert accepts.startswith("x dim 0: batch 2 or more") and "not at 1" in accepts
        assert "fail_accuracy" not in accepts  # refused there now, not wrong
        assert sum("AOTInductor compiled" in n for n in notes) == (to == "aoti"), notes


@pytest.mark.slow
def test_an_aoti_package_checks_its_inputs_without_the_environment_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Compiled for x [2, 8] (no dynamic dim), the package refuses another batch and another
    dtype in a process that never set AOTI_RUNTIME_CHECK_INPUTS: it returned numbers for them."""
    from fixtures.models import MLP

    model = seeded(MLP())
    out = tmp_path / "mlp.aoti.pt2"
    args = ["--model", "fixtures.models:MLP", "--input", "x:2x8:float32", "-o", str(out)]
    code, report, _ = run_cli([str(_checkpoint(tmp_path, model)), "--to", "aoti", *args], capsys)
    assert code == 0, report
    assert "checks every call's input" in report["interface"]["load"]
    assert any("checks every call's input dtypes, shapes and strides" in n for n in report["notes"])
    got = call_fresh("aoti", out, X[:2])
    torch.testing.assert_close(torch.tensor(got["out"]), model(X[:2]), rtol=1e-4, atol=1e-5)
    assert "unmatched dim value at 0" in call_fresh("aoti", out, X[:3])["raised"]
    assert "unmatched dtype" in call_fresh("aoti", out, X[:2].double())["raised"]
    from ptconvert.formats.aoti import runtime as aoti_runtime
    from ptconvert.formats.isolated import IsolatedRuntime

    runtime = IsolatedRuntime(
        "aoti", str(out), load=aoti_runtime.load
    )  # the reason it printed comes back in the error
    try:
        with pytest.raises(RuntimeError, match="unmatched dim value at 0"):
            runtime(x=X[:3])
        torch.testing.assert_close(runtime(x=X[:2])[0], model(X[:2]), rtol=1e-4, atol=1e-5)
    finally:
        runtime.close()


_CALL_TWO = """
import sys, torch
runner = torch._inductor.aoti_load_package(sys.argv[1])
x = torch.randn(int(sys.argv[2]), int(sys.argv[3]), 8)
mask = torch.ones(int(sys.argv[4]), int(sys.argv[5]), dtype=torch.int64)
try:
    print("out", tuple(runner(x, mask).shape))
except Exception as exc:
    print("raised", exc)
"""


@pytest.mark.slow
def test_an_aoti_package_refuses_inputs_that_disagree_on_a_shared_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """x [b, s, 8] and mask [b, s] share b and s: the package checked each dim's range, not that
    the two agree, and returned numbers for a mask of another length or batch (the .pt2 and
    eager raise)."""
    from fixtures.models import MaskedMean

    out = tmp_path / "m.aoti.pt2"
    args = ["--model", "fixtures.models:MaskedMean", "--input", "x:2x6x8:float32"]
    args += ["--input", "mask:2x6:int64:=1", "--dynamic-batch", "--dynamic", "x:1:1:32"]
    args += ["--dynamic", "mask:1:1:32", "-o", str(out)]
    code, report, _ = run_cli(
        [str(_checkpoint(tmp_path, seeded(MaskedMean()))), "--to", "aoti", *args], capsys
    )
    assert code == 0, report
    env = {k: v for k, v in os.environ.items() if k != "AOTI_RUNTIME_CHECK_INPUTS"}

    def call(*sizes: int) -> str:
        argv = [sys.executable, "-c", _CALL_TWO, str(out), *map(str, sizes)]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.strip().splitlines()[-1]

    assert call(3, 7, 3, 7) == "out (3, 4)"
    assert "mask dim 1 is 9 but must equal x dim 1, which is 7" in call(3, 7, 3, 9)
    assert "mask dim 0 is 2 but must equal x dim 0, which is 3" in call(3, 7, 2, 7)


def test_the_check_gate_of_the_generated_code_is_removed_or_the_compile_fails() -> None:
    from ptconvert.formats.aoti.edges.compile import _ungate

    lines: list[Any] = [
        "AOTI_NOINLINE static void __check_inputs_outputs(",
        "    if (!_check_aoti_runtime_check_inputs_env()){",
        "        return;",
        "    }",
        "check_input_0(input_handles);",
    ]
    _ungate(lines)
    assert not any("return;" in line for line in lines) and lines[-1].startswith("check_input_0")
    with pytest.raises(RuntimeError, match="writes its input checks differently"):
        _ungate(lines)  # nothing left to remove: this torch's code is not the one expected


def test_inputs_sharing_a_symbolic_size_get_a_check_that_they_agree() -> None:
    import sympy

    from ptconvert.formats.aoti.edges.compile import _check_shared_dims

    class Box:
        def __init__(self, *size: object) -> None:
            self.size = list(size)

        def get_size(self) -> list[object]:
            return self.size

    b, s = sympy.Symbol("s0"), sympy.Symbol("s1")
    lines: list[Any] = ["static void __check_inputs_outputs(", "check_input_0(h);", "}"]
    _check_shared_dims(lines, [Box(b, s, 8), Box(b, s), Box(4)], ["x", "mask", "w"])
    assert lines[0] == "static void __check_inputs_outputs(" and lines[-1] == "}"
    checks = [line for line in lines if line.startswith("if (")]
    assert len(checks) == 2  # mask's dims 0 and 1 against x's; w shares nothing
    assert (
        "input_handles[1]).sizes()[0] != ConstantHandle(input_handles[0]).sizes()[0]" in checks[0]
    )
    assert "mask dim 1 is" in checks[1] and "must equal x dim 1" in checks[1]


@pytest.fixture
def two_threads() -> Iterator[None]:
    """Two compute threads (on any machine): the fresh-process check then takes one of them
    while the comparison runs."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("two_threads")
def test_determinism_is_judged_at_one_thread_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Eager's first call ran on two threads, its second beside the fresh-process check on one:
    outputs that differ only between thread counts are not nondeterminism."""
    out = tmp_path / "sums.pt2"
    args = ["--model", "fixtures.models:ThreadSums", "--input", "x:2x8:float32", "-o", str(out)]
    weights = _checkpoint(tmp_path, seeded(ThreadSums()))
    code, report, _ = run_cli([str(weights), "--to", "pt2", *args, "--dynamic-batch"], capsys)
    assert code == 0, report
    assert report["route"][-2:] == ["module → exported", "exported → pt2"]  # not a fallback
    assert not any("failed the parity check" in n for n in report["notes"]), report["notes"]


@pytest.mark.usefixtures("two_threads")
def test_a_tiny_vit_is_not_refused_as_nondeterministic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real transformers ViT whose sums differ in their last bits between one and two threads
    (on the machine this was written on) and not between two runs at one count."""
    import transformers

    config = transformers.ViTConfig(
        hidden_size=256,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=1024,
        image_size=64,
        patch_size=16,
        num_labels=3,
    )
    torch.manual_seed(0)
    transformers.ViTForImageClassification(config).eval().save_pretrained(tmp_path / "vit")
    out = tmp_path / "vit.pt2"
    code, report, _ = run_cli(
        [str(tmp_path / "vit"), "--to", "pt2", "--dynamic-batch", "-o", str(out)], capsys
    )
    assert code == 0, report
    assert report["route"][-2:] == ["module → exported", "exported → pt2"]  # not a fallback


@pytest.mark.parametrize("given", ["--input", "--example-inputs"])
def test_only_the_batched_input_changes_with_the_batch(
    given: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``table`` [10, 4] is no batch (the model asserts its 10 rows): the sizes compared and the
    range probes resize ``x`` only, and the example keeps the shapes given."""
    from safetensors.torch import save_file

    if given == "--input":
        inputs = ["--input", "x:2x8:float32", "--input", "table:10x4:float32"]
    else:
        example = {"x": torch.randn(2, 8), "table": torch.randn(10, 4)}
        save_file(example, tmp_path / "example.safetensors")
        inputs = ["--example-inputs", str(tmp_path / "example.safetensors")]
    weights = _checkpoint(tmp_path, seeded(FixedTable()))
    out = tmp_path / "table.pt2"
    args = ["--model", "fixtures.models:FixedTable", *inputs, "--dynamic", "x:0", "-o", str(out)]
    code, report, _ = run_cli([str(weights), "--to", "pt2", *args], capsys)
    assert code == 0, report
    assert [s["batch"] for s in report["parity"]["sizes"]] == [1, 2, 3, 5, 7]
    assert report["interface"]["example"] == {"x": [2, 8], "table": [10, 4]}
    assert report["interface"]["accepts"][0].startswith("x dim 0: batch 2 or more")


@pytest.mark.parametrize("to", ["pt2", "onnx"])
@pytest.mark.parametrize("given", ["x first", "table first", "--example-inputs"])
def test_dynamic_batch_leaves_the_rows_the_model_fixes(
    to: str, given: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--dynamic-batch`` with ``table`` [10, 4] beside ``x`` [2, 8], in any order (a
    safetensors file of example inputs sorts them: table first): torch.export finds the table's
    rows fixed by the model's assert, and the export is done again with them as given (a note
    says so), not given up for TorchScript and its renamed inputs; the file runs at batch 5."""
    from safetensors.torch import save_file

    weights = _checkpoint(tmp_path, seeded(FixedTable()))
    out = tmp_path / f"table.{to}"
    args = [str(weights), "--to", to, "--model", "fixtures.models:FixedTable", "--dynamic-batch"]
    specs = ["--input", "x:2x8:float32", "--input", "table:10x4:float32"]
    if given == "table first":
        specs = [*specs[2:], *specs[:2]]
    elif given == "--example-inputs":
        example = {"x": torch.randn(2, 8), "table": torch.randn(10, 4)}
        save_file(example, tmp_path / "example.safetensors")
        specs = ["--example-inputs", str(tmp_path / "example.safetensors")]
    code, report, _ = run_cli([*args, *specs, "-o", str(out), "--no-cache"], capsys)
    assert code == 0, report
    assert "torchscript" not in " ".join(report["route"]), report["route"]
    assert list(report["dynamic_range"]) == ["x dim 0"], report["dynamic_range"]
    said = "--dynamic-batch: table (10 rows) not batched"
    assert any(n.startswith(said) for n in report["notes"]), report["notes"]
    x, table = torch.randn(5, 8), torch.randn(10, 4)
    expected = seeded(FixedTable()).eval()(x, table)
    if to == "pt2":
        got = torch.export.load(str(out)).module()(x, table)
    else:
        import onnxruntime as ort

        session = ort.InferenceSession(str(out))
        (got,) = session.run(None, {"x": x.numpy(), "table": table.numpy()})
        got = torch.from_numpy(got)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_dynamic_batch_leaves_a_row_broadcast_over_the_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pos`` [1, 8]: torch.export refuses a dynamic dim of size 1 in other words than a
    constraint violation (0/1 specialisation); the export is done again with it as given."""
    weights = _checkpoint(tmp_path, seeded(RowBroadcast()))
    out = tmp_path / "row.pt2"
    args = [str(weights), "--to", "pt2", "--model", "fixtures.models:RowBroadcast"]
    args += ["--dynamic-batch", "--input", "x:2x8:float32", "--input", "pos:1x8:float32"]
    code, report, _ = run_cli([*args, "-o", str(out), "--no-cache"], capsys)
    assert code == 0, report
    assert report["route"][-2:] == ["module → exported", "exported → pt2"], report["route"]
    assert any(n.startswith("--dynamic-batch: pos (1 row) not batched") for n in report["notes"])
    x, pos = torch.randn(5, 8), torch.randn(1, 8)
    program = torch.export.load(str(out)).module()
    torch.testing.assert_close(program(x, pos), seeded(RowBroadcast()).eval()(x, pos))


def test_a_range_is_narrowed_only_where_the_file_refuses_what_it_leaves_out() -> None:
    """Wrong sizes all outside the range that holds: a .pt2 or an AOTI package is exported
    again with that range; ONNX cannot bound a dim, and a wrong size inside the range cannot be
    left out by a bound: both refused."""
    from ptconvert.convert.program_check import RangeTooWide, _runs_wrong
    from ptconvert.convert.state import RunState
    from ptconvert.errors import VerificationError
    from ptconvert.verify.dims import DynamicDim
    from ptconvert.verify.range_findings import DimRange

    dim = DynamicDim("x", 0, "s0", "s0", 2, None, symbol_min=2, rank=2)
    state = RunState(Path("model.pt"), "pt")
    below = DimRange(dim, "holds", 2, None, text="batch 2 or more; not at 1: …", wrong=[1])
    above = DimRange(dim, "narrowed", 2, 16, text="runs for batch 2–16; …", wrong=[1, 17, 32])
    for to, ranges, bounds in (("aoti", below, (2, None)), ("pt2", above, (2, 16))):
        narrowed = _runs_wrong(state, to, [ranges])
        assert isinstance(narrowed, RangeTooWide) and narrowed.bounds == {("x", 0): bounds}
        assert narrowed.note.startswith(f"x dim 0 bounded to {bounds[0]}")
    refused = _runs_wrong(state, "onnx", [below])
    assert type(refused) is VerificationError and "cannot bound" in refused.message
    inside = DimRange(dim, "holds", 2, None, text="batch 2 or more", wrong=[7])
    assert type(_runs_wrong(state, "pt2", [inside])) is VerificationError
