"""`ptconvert verify REFERENCE CANDIDATE` through the CLI, with every runtime it offers."""

from __future__ import annotations

from pathlib import Path

import torch

from fixtures.models import MLP, seeded
from ptconvert.convert.engine import convert_program
from ptconvert.options import Options
from tests.conftest import run_cli

MLP_ARGS = ["--model", "fixtures.models:MLP", "--input", "x:2x8:float32"]


def _pt2(src: Path, out: Path) -> Path:
    convert_program(
        src,
        "pt2",
        out,
        Options(model="fixtures.models:MLP", inputs=["x:2x8:float32"], dynamic_batch=True),
    )
    return out


def test_verify_passes_and_reports_every_measure(samples, tmp_path, capsys) -> None:
    program = _pt2(samples["mlp_zip"], tmp_path / "m.pt2")
    code, report, _ = run_cli(["verify", str(samples["mlp_zip"]), str(program), *MLP_ARGS], capsys)
    assert code == 0 and report["status"] == "pass" and report["kind"] == "program"
    assert report["batches"] == [1, 2, 3, 5, 7]
    for size in report["parity"]["sizes"]:
        (out,) = size["outputs"]
        assert out["status"] == "pass" and out["outside_tolerance"] == 0.0
        assert 0 <= out["max_abs_error"] <= 1e-6 and 0 <= out["max_rel_error"] <= 1e-3
        # the fp64 run happened: eager's own float32 error is measured, and the program's is
        # of the same size (export keeps eager's arithmetic)
        assert 0 < out["eager_rmse_vs_fp64"] < 1e-6
        assert 0 < out["rmse_vs_fp64"] <= 2 * out["eager_rmse_vs_fp64"] + 1e-7
        assert out["cosine"] > 0.999999
    assert report["parity"]["fp64_reference"] is True
    assert report["environment"]["torch"] == torch.__version__  # recorded, whichever is installed


def test_verify_fails_on_different_weights(samples, tmp_path, capsys) -> None:
    program = _pt2(samples["mlp_zip"], tmp_path / "m.pt2")
    other = tmp_path / "other.pt"
    torch.save(seeded(MLP(), seed=9).state_dict(), other)
    code, report, _ = run_cli(["verify", str(other), str(program), *MLP_ARGS], capsys)
    assert code == 6 and "fail_accuracy" in report["error"]["message"]
    code, report, _ = run_cli(
        ["verify", str(other), str(program), *MLP_ARGS, "--warn-only"], capsys
    )
    assert code == 0 and report["status"] == "fail_accuracy"


def test_verify_weights_bitwise(samples, tmp_path, capsys) -> None:
    from ptconvert import convert as convert_weights

    convert_weights(samples["mlp_zip"], "safetensors", tmp_path / "w.safetensors")
    code, report, _ = run_cli(
        ["verify", str(samples["mlp_zip"]), str(tmp_path / "w.safetensors")], capsys
    )
    assert code == 0 and report["kind"] == "weights" and report["weights"]["tensors"] == 4
    other = tmp_path / "other.pt"
    torch.save(seeded(MLP(), seed=9).state_dict(), other)
    code, report, _ = run_cli(["verify", str(samples["mlp_zip"]), str(other)], capsys)
    assert code == 6 and "bytes differ" in report["error"]["message"]


def test_verify_torchscript_and_onnx_runtimes(samples, capsys) -> None:
    for candidate in ("mlp_scripted", "mlp_onnx", "mlp_pt2"):
        code, report, _ = run_cli(
            ["verify", str(samples["mlp_zip"]), str(samples[candidate]), *MLP_ARGS], capsys
        )
        assert code == 0 and report["status"] == "pass", (candidate, report)


def test_verify_needs_a_model_for_weights_against_a_program(samples, capsys) -> None:
    code, report, _ = run_cli(["verify", str(samples["mlp_zip"]), str(samples["mlp_pt2"])], capsys)
    assert code == 5 and "--model" in report["error"]["hint"]


def test_onnx_runs_in_a_spawned_process(samples) -> None:
    import os

    from ptconvert.formats.isolated import IsolatedRuntime
    from ptconvert.verify.runtime import open_runtime

    runtime = open_runtime(samples["mlp_onnx"], Options())
    assert isinstance(runtime.call, IsolatedRuntime)
    assert runtime.call._proc.pid != os.getpid() and runtime.call._proc.is_alive()
    x = torch.randn(3, 8)
    (y,) = runtime.call(x=x)
    torch.testing.assert_close(y, seeded(MLP())(x))
    runtime.call.close()
    assert not runtime.call._proc.is_alive()


def test_seed_and_device_options(samples, capsys) -> None:
    args = ["verify", str(samples["mlp_zip"]), str(samples["mlp_pt2"]), *MLP_ARGS, "--seed", "7"]
    code, report, _ = run_cli(args, capsys)
    assert code == 0 and report["environment"]["device"] == "cpu"
    if not torch.cuda.is_available():
        code, report, _ = run_cli([*args, "--device", "cuda"], capsys)
        assert code == 5 and "CUDA is not available" in report["error"]["message"]


def test_a_bounded_dynamic_batch_is_checked_at_its_maximum(samples, capsys) -> None:
    code, report, _ = run_cli(
        ["verify", str(samples["mlp_zip"]), str(samples["mlp_pt2"]), *MLP_ARGS], capsys
    )
    assert code == 0 and report["batches"] == [1, 2, 3, 5, 7, 64]  # the fixture's Dim max is 64


def _hand_exported(tmp_path: Path, model: torch.nn.Module, args: tuple, shapes: dict) -> Path:
    """``model`` exported by torch itself, as someone else wrote it, and its weights."""
    torch.save(model.state_dict(), tmp_path / "w.pt")
    torch.export.save(torch.export.export(model, args, dynamic_shapes=shapes), tmp_path / "p.pt2")
    return tmp_path / "p.pt2"


def test_a_program_that_runs_wrong_outside_its_range_fails(tmp_path, capsys) -> None:
    """torch.export's BatchBranch runs at batch 1 and returns the batch-2 branch's numbers:
    the range that holds leaves 1 out, but the program takes it."""
    from fixtures.models import BatchBranch, batch_branch_dynamic_shapes, batch_branch_example_args

    model = seeded(BatchBranch())
    program = _hand_exported(
        tmp_path, model, batch_branch_example_args, batch_branch_dynamic_shapes
    )
    args = [
        "verify",
        str(tmp_path / "w.pt"),
        str(program),
        "--model",
        "fixtures.models:BatchBranch",
    ]
    code, report, _ = run_cli([*args, "--input", "x:2x8:float32"], capsys)
    assert code == 6 and "x dim 0 at [1]" in report["error"]["message"], report
    code, report, _ = run_cli([*args, "--input", "x:2x8:float32", "--warn-only"], capsys)
    assert code == 0 and report["status"] == "fail_accuracy"


def test_only_the_programs_batched_inputs_change_with_the_batch(tmp_path, capsys) -> None:
    from fixtures.models import FixedTable

    model = seeded(FixedTable())
    example = (torch.randn(2, 8), torch.randn(10, 4))
    shapes = {"x": {0: torch.export.Dim.DYNAMIC}, "table": None}
    program = _hand_exported(tmp_path, model, example, shapes)
    inputs = ["--input", "x:2x8:float32", "--input", "table:10x4:float32"]
    args = [str(tmp_path / "w.pt"), str(program), "--model", "fixtures.models:FixedTable", *inputs]
    code, report, _ = run_cli(["verify", *args], capsys)
    assert code == 0 and report["batches"] == [1, 2, 3, 5, 7], report
