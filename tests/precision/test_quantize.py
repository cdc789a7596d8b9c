"""``--quantize int8``: ONNX quantized by onnxruntime after the export and judged by accuracy
against float32 eager; pt2 quantized by torchao before export (int8 weights in the archive);
targets without the scheme refused before work naming those with it; a missed threshold is exit 6.
Each program is run here by its own runtime and compared with float32 eager independently."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ptconvert
from tests.conftest import run_cli
from tests.generation.conftest import build
from tests.precision.llama3m import VOCAB, build_llama_3m

MLP_SPEC = {"model": "fixtures.models:MLP", "inputs": ["x:2x8:float32"]}


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    x, y = a.detach().double().flatten(), b.detach().double().flatten()
    return float(torch.nn.functional.cosine_similarity(x, y, 0))


def _onnx_logits_close(onnx_file: Path, directory: Path, vocab: int) -> None:
    """onnxruntime runs the file at batch 1 and 3; its logits' cosine to float32 eager ≥ 0.98."""
    import onnxruntime as ort
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    for rows in (1, 3):
        ids = torch.randint(3, vocab - 1, (rows, 9), generator=torch.Generator().manual_seed(rows))
        feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones_like(ids.numpy())}
        (logits,) = session.run(["logits"], feeds)
        with torch.no_grad():
            want = model.eval()(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        assert _cosine(torch.from_numpy(logits), want) >= 0.98, rows


def _ops(path: Path) -> Counter[str]:
    import onnx

    return Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build("llama", tmp_path_factory.mktemp("llama"))


def test_an_onnx_int8_holds_integer_matmuls_and_is_judged_by_accuracy(
    llama: Path, tmp_path: Path
) -> None:
    out = tmp_path / "q.onnx"
    # a 2-layer random model's logits are nearly flat: its largest error at batch 5 is 19 % of
    # the largest logit (u8u8, cosine 0.998); the cosine floor stays the default
    report = ptconvert.convert(
        llama, "onnx", out, quantize="int8", dynamic_batch=True, max_error=0.25
    )
    ops = _ops(out)
    assert ops["MatMulInteger"] >= 14 and ops["DynamicQuantizeLinear"] >= 1, ops
    assert report.quantized is not None and report.quantized.quantized == ops["MatMulInteger"]
    assert set(report.quantized.left.values()) <= {"two activations (no weight to quantize)"}
    assert report.accuracy is not None and report.accuracy.dtype == "int8"
    assert report.accuracy.status == "pass" and report.accuracy.min_cosine == 0.98
    assert "uint8 weights" in report.quantized.by, report.quantized.by
    assert any("judged by accuracy" in n for n in report.notes), report.notes
    _onnx_logits_close(out, llama, 99)


@pytest.mark.slow  # a 3.9 M-parameter Llama exported twice (~60 s); the tiny one above is fast
def test_a_3m_llama_onnx_int8_is_at_most_0_4_of_float32_and_close(tmp_path: Path) -> None:
    directory = build_llama_3m(tmp_path / "llama3m")
    full, quantized = tmp_path / "f.onnx", tmp_path / "q.onnx"
    ptconvert.convert(directory, "onnx", full, dynamic_batch=True, verify=False, cache=False)
    report = ptconvert.convert(
        directory, "onnx", quantized, dynamic_batch=True, quantize="int8", cache=False
    )
    assert quantized.stat().st_size <= 0.4 * full.stat().st_size
    assert _ops(quantized)["MatMulInteger"] == 29  # 7 Linear a layer, and the head
    assert report.accuracy is not None and report.quantized is not None
    _onnx_logits_close(quantized, directory, VOCAB)


def test_a_pt2_int8_holds_int8_weights_loaded_by_torch_export(
    samples: dict[str, Path], tmp_path: Path
) -> None:
    from fixtures.models import MLP, seeded

    out = tmp_path / "mlp.pt2"
    report = ptconvert.convert(
        samples["mlp_zip"], "pt2", out, **MLP_SPEC, quantize="int8", dynamic_batch=True, cache=False
    )
    assert report.check == "parity" and report.parity.status == "pass"
    assert report.accuracy is not None and report.accuracy.status == "pass"
    assert report.quantized is not None and report.quantized.quantized_names == ["fc1", "fc2"]
    program: Any = torch.export.load(out)
    weights = {k: v for k, v in program.state_dict.items() if k.endswith("weight")}
    assert {k: v.qdata.dtype for k, v in weights.items()} == {
        "fc1.weight": torch.int8,
        "fc2.weight": torch.int8,
    }
    x = torch.randn(3, 8)
    assert _cosine(program.module()(x), seeded(MLP())(x)) >= 0.98


@pytest.mark.parametrize(
    ("to", "why"),
    [("torchscript", "cannot be scripted"), ("safetensors", "quantized weights files")],
)
def test_a_target_without_the_scheme_is_refused_before_work_naming_those_with_it(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], to: str, why: str
) -> None:
    out = tmp_path / f"m.{to}"
    args = [str(samples["mlp_zip"]), "--to", to, "--model", MLP_SPEC["model"]]
    args += ["--input", MLP_SPEC["inputs"][0], "--quantize", "int8", "-o", str(out)]
    code, report, _ = run_cli(args, capsys)
    assert code == 4 and f"--to {to} cannot hold --quantize int8" in report["error"]["message"]
    assert why in report["error"]["message"]
    assert report["error"]["hint"] == "--quantize int8 is written by --to onnx or pt2"
    assert not list(tmp_path.iterdir())


def test_an_int8_threshold_missed_is_exit_6(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mlp.pt2"
    args = ["--model", MLP_SPEC["model"], "--input", MLP_SPEC["inputs"][0], "-o", str(out)]
    code, report, _ = run_cli(
        ["--to", "pt2", *args, "--quantize", "int8", "--min-cosine", "1.0", "--no-cache"], capsys
    )
    message = report["error"]["message"]
    assert code == 6 and "the int8 program is further from the float32 model" in message, report
    assert not out.exists()


def test_quantize_on_a_generation_export_is_refused_before_work(
    llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [str(llama), "--to", "pt2", "--task", "text-generation-with-past", "--quantize", "int8"]
    code, report, _ = run_cli([*args, "-o", str(tmp_path / "g.pt2")], capsys)
    assert code == 4 and "--quantize int8 is not there yet" in report["error"]["message"]
