"""``--to all``: one model through every format the graph reaches, each read back by the format's
own loader, the programs timed beside eager and torch.compile."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fixtures.models import MLP
from tests.conftest import run_cli

MLP_ARGS = ["--model", "fixtures.models:MLP", "--input", "x:2x8:float32", "--dynamic-batch"]


@pytest.mark.slow  # an AOTInductor compile and torch.compile
def test_every_format_is_written_verified_and_timed(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "every"
    code, report, _ = run_cli(
        [str(samples["mlp_zip"]), "--to", "all", "-o", str(out), *MLP_ARGS], capsys
    )
    assert code == 0
    rows = {r["format"]: r for r in report["rows"]}
    assert {f: r["status"] for f, r in rows.items()} == {
        "safetensors": "ok",  # not sharded, nor hf: another target's option writes them
        "torchscript": "ok",
        "pt2": "ok",
        "aoti": "ok",
        "onnx": "ok",
        "pte": "ok",
        "gguf": "skipped",  # no route leads to it from a pickle
    }
    assert rows["safetensors"]["check"] == "bitwise"
    programs = ("torchscript", "pt2", "aoti", "onnx", "pte")
    assert all(rows[f]["check"] == "parity" for f in programs)
    assert set(report["baselines"]) == {"eager", "torch.compile"}
    for f in programs:
        assert set(rows[f]["median_ms"]) == {"1", "8"}, f
        assert rows[f]["vs_eager"] > 0 and rows[f]["vs_compile"] > 0, f
        assert rows[f]["size"] == Path(rows[f]["output"]).stat().st_size

    # each file, read back by its own loader in a new interpreter, computes what eager does
    model = MLP()
    model.load_state_dict(torch.load(samples["mlp_zip"], weights_only=True))
    x = torch.randn(3, 8)
    outputs = {f: r["output"] for f, r in rows.items() if r["status"] == "ok"}
    torch.save({"x": x, "y": model(x).detach(), "outputs": outputs}, tmp_path / "io.pt")
    script = f"""
import torch, onnxruntime
from safetensors.torch import load_file
from torch._inductor import aoti_load_package
io = torch.load({str(tmp_path / "io.pt")!r})
r, x, y = io["outputs"], io["x"], io["y"]
assert set(load_file(r["safetensors"])) == {{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}}
outs = [torch.jit.load(r["torchscript"])(x), torch.export.load(r["pt2"]).module()(x),
        aoti_load_package(r["aoti"])(x)]
s = onnxruntime.InferenceSession(r["onnx"])
outs.append(torch.from_numpy(s.run(None, {{s.get_inputs()[0].name: x.numpy()}})[0]))
from executorch.runtime import Runtime
outs.append(Runtime.get().load_program(r["pte"]).load_method("forward").execute([x])[0])
for o in outs:
    torch.testing.assert_close(o, y, rtol=1e-4, atol=1e-5)
print("ok", len(outs))
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["ok", "5"]

    # issue 44: a rerun (as after an interruption) keeps what is complete, where it answered
    # "output exists" (exit 8) for each finished format
    written = {f: Path(o).stat().st_mtime_ns for f, o in outputs.items()}
    code, again, _ = run_cli(
        [str(samples["mlp_zip"]), "--to", "all", "-o", str(out), *MLP_ARGS], capsys
    )
    assert code == 0
    kept = {r["format"]: r for r in again["rows"] if r["status"] == "ok"}
    assert set(kept) == set(outputs)
    assert all("kept from an earlier run" in r["reason"] for r in kept.values())
    assert {f: Path(o).stat().st_mtime_ns for f, o in outputs.items()} == written
    assert kept["pt2"]["check"] == "parity" and kept["pt2"]["median_ms"]


def test_every_format_needs_an_output_folder(
    samples: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report, _ = run_cli([str(samples["mlp_zip"]), "--to", "all", *MLP_ARGS], capsys)
    assert code == 2
    assert "-o OUT_DIR" in report["error"]["message"]


BOOM = """
import torch
from torch import nn


class Boom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("this model cannot run")


def make() -> nn.Module:
    return Boom()
"""


def test_a_model_that_raises_fails_every_program_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "boom.py").write_text(BOOM)
    torch.save({"fc.weight": torch.ones(4, 8), "fc.bias": torch.zeros(4)}, tmp_path / "w.pt")
    args = [str(tmp_path / "w.pt"), "--to", "all", "-o", str(tmp_path / "every")]
    args += ["--model", f"{tmp_path / 'boom.py'}:make", "--input", "x:2x8:float32"]
    code, report, _ = run_cli(args, capsys)
    rows = {r["format"]: r for r in report["rows"]}
    assert code == 4  # the model's own error, as for one target
    assert rows["safetensors"]["status"] == "ok"  # weights need no run
    for f in ("torchscript", "pt2", "aoti", "onnx"):
        assert rows[f]["status"] == "failed", f
        assert "cannot run" in rows[f]["reason"], rows[f]
    assert "sharded" not in rows and "hf" not in rows  # another target's option writes them
    assert report["baselines"] == {}  # nothing to time
    code, report, _ = run_cli(args, capsys)  # a rerun: what passed is kept, the rest tried again
    rows = {r["format"]: r for r in report["rows"]}
    assert code == 4 and "kept from an earlier run" in rows["safetensors"]["reason"]
    assert rows["pt2"]["status"] == "failed"


def test_the_table_fits_80_columns_with_every_route_said() -> None:
    from rich.console import Console

    from ptconvert.convert.every import EveryFormatReport, FormatRow
    from ptconvert.render import render_every

    route = ["pt → weights", "weights → module", "module → exported", "exported → aoti"]
    rows = [
        FormatRow(
            "aoti", "ok", "", "o/mlp.pt2", route, 1536000, "parity", {1: 0.1, 8: 0.2}, 0.4, 1.0
        ),
        FormatRow("sharded", "skipped", "sharded is written by another target's option"),
    ]
    report = EveryFormatReport(
        "mlp.pt", "pt", "o", [1, 8], rows, 12.5, {"eager": {1: 0.04, 8: 0.08}}
    )
    console = Console(width=80, record=True, color_system=None)
    render_every(report, console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "aoti: pt → weights → module → exported → aoti" in text
    assert "0.100 / 0.200" in text and "sharded: skipped: sharded is written" in text
