"""``info`` of quantized and half-precision files: the dtype histogram with the bytes each dtype
is stored in, and what is quantized (ONNX's quantized operators and their int8 weights, a pt2's
torchao weights named by their class), read without running anything. The files are written
here by the libraries themselves (onnxruntime's quantizer, torchao and torch.export), not by a
conversion."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli


def test_an_onnx_quantized_by_onnxruntime_shows_its_quantized_ops_and_int8_weights(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = tmp_path / "q.onnx"
    quantize_dynamic(samples["mlp_onnx"], out, per_channel=True, weight_type=QuantType.QInt8)
    code, info, _ = run_cli(["info", str(out)], capsys)
    assert code == 0, info
    assert info["quantized"] == {
        "ops": {"DynamicQuantizeLinear": 2, "MatMulInteger": 2},
        "weights": {"int8": 2},  # fc1's and fc2's, transposed (the zero points are not weights)
    }
    # the weights and their per-channel zero points in int8, the scales and biases in float32
    assert info["dtypes"]["int8"] == {"tensors": 4, "elements": 128 + 64 + 16 + 4, "bytes": 212}
    assert info["dtypes"]["float32"]["bytes"] == 4 * info["dtypes"]["float32"]["elements"]
    text = _rendered(out)
    assert "ops: DynamicQuantizeLinear ×2, MatMulInteger ×2" in text
    assert "int8 ×4 (212 el., 212 B)" in text


def test_a_float32_file_has_no_quantization_and_its_bytes_per_dtype(
    samples: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, info, _ = run_cli(["info", str(samples["mlp_onnx"])], capsys)
    assert code == 0 and info["quantized"] is None
    assert info["dtypes"] == {"float32": {"tensors": 4, "elements": 212, "bytes": 848}}


def test_a_pt2_of_torchao_int8_weights_names_them_quantized_without_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _torchao_pt2(tmp_path / "q.pt2")
    # no pickle runs: torch.load and pickle's unpicklers refuse to, should info call them
    monkeypatch.setattr(torch, "load", _refuse)
    code, info, _ = run_cli(["info", str(out)], capsys)
    assert code == 0, info
    assert info["quantized"] == {"ops": {}, "weights": {"torchao.Int8Tensor": 2}}
    stored = info["dtypes"]["torchao.Int8Tensor"]
    # int8 values, then a float32 scale and an int8 zero point per output row
    assert stored == {"tensors": 2, "elements": 192, "bytes": 192 + 20 * 4 + 20}
    assert info["dtypes"]["float32"] == {"tensors": 2, "elements": 20, "bytes": 80}
    assert not any("stored as a pickle" in n for n in info["notes"]), info["notes"]


def test_a_pickled_pt2_weight_of_another_class_is_only_noted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A weight pickled as a class of no quantizing library is not called quantized: the note
    names its class (torchao's class renamed in the archive, bytes for bytes)."""
    quantized = _torchao_pt2(tmp_path / "q.pt2")
    out = tmp_path / "other.pt2"
    renamed = quantized.read_bytes().replace(b"torchao.quantization", b"someone.quantization")
    out.write_bytes(renamed)
    code, info, _ = run_cli(["info", str(out)], capsys)
    assert code == 0, info
    assert info["quantized"] is None and "float32" in info["dtypes"]
    note = "weight 'fc1.weight' is stored as a pickle of someone.quantization.Int8Tensor"
    assert note in info["notes"], info["notes"]


def _torchao_pt2(out: Path) -> Path:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    from fixtures.models import MLP, seeded

    model = seeded(MLP()).eval()
    quantize_(model, Int8WeightOnlyConfig(set_inductor_config=False))
    torch.export.save(torch.export.export(model, (torch.randn(2, 8),)), out)
    return out


def _rendered(path: Path) -> str:
    from rich.console import Console

    from ptconvert.formats import describe
    from ptconvert.render import render_info

    console = Console(file=io.StringIO(), width=240)
    render_info(describe(path), console)
    return console.file.getvalue()  # type: ignore[attr-defined]


def _refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError("info loaded a pickle")
