"""A model defined by code alone converts: ``ptconvert --model pkg.mod:factory --to …`` without
a checkpoint (ExportDB's examples have no parameters; a factory may load its own weights), and a
checkpoint without tensors is accepted when --model says which model it is. Both were refused:
no SRC was a usage error, an empty state dict "holds no tensors" (exit 3)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ptconvert.errors import MissingRequirementError, UsageError
from tests.conftest import run_cli

# written the way torch/_export/db/examples writes its models: no parameters, a shape-driven
# view, an input-independent constant
EXPORTDB_LIKE = """
import torch


class DynamicShapeView(torch.nn.Module):
    def forward(self, x):
        new_x_shape = x.size()[:-1] + (2, 5)
        x = x.view(*new_x_shape)
        return x.permute(0, 2, 1)


def make():
    return DynamicShapeView()


class Seeded(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(7)  # the factory's own weights, the same in every process
        self.lin = torch.nn.Linear(10, 3)

    def forward(self, x):
        return self.lin(x)
"""


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "exportdb_like.py").write_text(EXPORTDB_LIKE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_model_from_code_alone_converts(models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = models / "view.pt2"
    args = ["--model", "exportdb_like:make", "--to", "pt2", "--input", "x:4x10:float32"]
    code, report, _ = run_cli([*args, "--dynamic-batch", "-o", str(out), "--no-cache"], capsys)
    assert code == 0, report
    assert report["check"] == "parity" and report["source"] == "exportdb_like:make"
    assert any("no weights were loaded" in n for n in report["notes"])
    program = torch.export.load(out).module()
    x = torch.randn(3, 10)
    torch.testing.assert_close(program(x), x.view(3, 2, 5).permute(0, 2, 1))


def test_a_checkpoint_without_tensors_is_accepted_with_model(
    models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.save({}, models / "empty.pt")
    args = [str(models / "empty.pt"), "--to", "torchscript", "--input", "x:2x10:float32"]
    code, report, _ = run_cli([*args, "-o", str(models / "s.ts")], capsys)
    assert code == MissingRequirementError.exit_code, report  # which model: --model says
    assert "model_spec" in report["error"]["message"]
    code, report, _ = run_cli(
        [*args, "--model", "exportdb_like:Seeded", "-o", str(models / "s.ts")], capsys
    )
    assert code == 0, report
    scripted = torch.jit.load(str(models / "s.ts"))
    import exportdb_like  # type: ignore[import-not-found]

    x = torch.randn(2, 10)
    torch.testing.assert_close(scripted(x), exportdb_like.Seeded()(x))


def test_no_source_needs_a_model_and_an_output(
    models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report, _ = run_cli(["--to", "pt2", "-o", str(models / "a.pt2")], capsys)
    assert code == UsageError.exit_code and "--model" in report["error"]["message"]
    code, report, _ = run_cli(["--model", "exportdb_like:make", "--to", "pt2"], capsys)
    assert code == UsageError.exit_code and "-o" in report["error"]["message"]
