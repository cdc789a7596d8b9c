"""``--dtype``: weights cast and checked bitwise against the source cast the same way, read back
by safetensors and transformers; programs exported at the dtype, checked against eager at it and
against float32 eager by accuracy, run by their own runtime (torch.export.load, onnxruntime)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ptconvert
from tests.conftest import run_cli
from tests.generation.conftest import build

MLP_SPEC = {"model": "fixtures.models:MLP", "inputs": ["x:2x8:float32"]}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build("llama", tmp_path_factory.mktemp("llama"))


def _float32_logits(directory: Path, ids: torch.Tensor) -> torch.Tensor:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with torch.no_grad():
        return model.eval()(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


def test_a_directory_to_bfloat16_safetensors_is_the_source_cast(
    llama: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "bf16"
    report = ptconvert.convert(llama, "safetensors", f"{out}/", dtype="bfloat16")
    assert report.check == "bitwise" and report.weights is not None
    assert report.weights.cast_to == "bfloat16"
    source, written = load_file(llama / "model.safetensors"), load_file(out / "model.safetensors")
    assert source.keys() == written.keys()
    for name, tensor in source.items():
        assert torch.equal(written[name], tensor.to(torch.bfloat16)), name
    ratio = (out / "model.safetensors").stat().st_size / (
        llama / "model.safetensors"
    ).stat().st_size
    assert ratio < 0.55, ratio
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(out)  # the config's dtype: no dtype= needed
    assert model.dtype == torch.bfloat16


def test_only_floating_tensors_are_cast_and_the_note_says_what_was_kept(tmp_path: Path) -> None:
    from safetensors import safe_open

    src = tmp_path / "mixed.pt"
    torch.save({"w": torch.randn(4, 8), "steps": torch.tensor([3]), "mask": torch.ones(2) > 0}, src)
    report = ptconvert.convert(src, "safetensors", tmp_path / "o.safetensors", dtype="float16")
    with safe_open(tmp_path / "o.safetensors", "pt") as f:
        dtypes = {k: f.get_tensor(k).dtype for k in f.keys()}  # noqa: SIM118
    assert dtypes == {"w": torch.float16, "steps": torch.int64, "mask": torch.bool}
    assert any("kept as they are: 1 bool, 1 int64" in n for n in report.notes), report.notes


def test_a_wrong_cast_fails_the_bitwise_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check compares with its own cast of the independent reading: a writer that rounds
    one value otherwise is caught (exit 6) and nothing is written."""
    from ptconvert.weights import cast

    real = cast.cast_weights

    def off_by_one_ulp(ws: Any, to: str) -> str:
        note = real(ws, to)
        first = ws.stored[0].tensor
        first.view(torch.int16).view(-1)[0] += 1
        return note

    monkeypatch.setattr(cast, "cast_weights", off_by_one_ulp)
    src = tmp_path / "w.pt"
    torch.save({"w": torch.randn(4, 8)}, src)
    out = tmp_path / "w.safetensors"
    code, report, _ = run_cli(
        [str(src), "--to", "safetensors", "--dtype", "bfloat16", "-o", str(out)], capsys
    )
    assert code == 6 and "bytes differ" in report["error"]["message"], report
    assert not out.exists()


def test_a_program_at_float16_is_checked_by_accuracy_against_float32(
    samples: dict[str, Path], tmp_path: Path
) -> None:
    from fixtures.models import MLP, seeded

    out = tmp_path / "mlp.pt2"
    report = ptconvert.convert(
        samples["mlp_zip"], "pt2", out, **MLP_SPEC, dtype="float16", dynamic_batch=True, cache=False
    )
    assert report.accuracy is not None and report.accuracy.status == "pass"
    assert {o.batch for o in report.accuracy.outputs} == {s.batch for s in report.parity.sizes}
    assert all(o.cosine >= 0.999 for o in report.accuracy.outputs), report.accuracy
    program = torch.export.load(out).module()
    assert {p.dtype for p in program.state_dict().values()} == {torch.float16}
    x = torch.randn(3, 8)
    got = program(x.half()).float()
    want = seeded(MLP())(x)
    assert (got - want).abs().max() <= 0.02 * want.abs().max()


def test_an_onnx_at_float16_holds_float16_weights_and_runs_in_onnxruntime(
    llama: Path, tmp_path: Path
) -> None:
    import onnx
    import onnxruntime as ort

    half = tmp_path / "half.onnx"
    report = ptconvert.convert(llama, "onnx", half, dtype="float16", dynamic_batch=True)
    assert report.accuracy is not None and report.accuracy.dtype == "float16"
    graph = onnx.load(str(half)).graph
    assert {t.data_type for t in graph.initializer} == {onnx.TensorProto.FLOAT16}
    full = tmp_path / "full.onnx"
    ptconvert.convert(llama, "onnx", full, dynamic_batch=True)
    assert half.stat().st_size < 0.8 * full.stat().st_size  # the graph's own bytes are a floor
    session = ort.InferenceSession(str(half), providers=["CPUExecutionProvider"])
    for rows in (1, 3):
        ids = torch.randint(3, 98, (rows, 7), generator=torch.Generator().manual_seed(rows))
        feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones_like(ids.numpy())}
        (logits,) = session.run(["logits"], feeds)
        assert logits.dtype == np.float16
        want = _float32_logits(llama, ids)
        error = (torch.from_numpy(logits).float() - want).abs().max()
        assert error <= 0.02 * want.abs().max(), (rows, float(error))


def test_an_accuracy_threshold_missed_is_exit_6_naming_the_output_and_metric(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mlp.pt2"
    args = ["--model", MLP_SPEC["model"], "--input", MLP_SPEC["inputs"][0], "-o", str(out)]
    args += ["--dtype", "bfloat16", "--min-cosine", "1.0", "--no-cache"]
    code, report, _ = run_cli(["--to", "pt2", *args], capsys)
    message = report["error"]["message"]
    assert code == 6 and "further from the float32 model" in message, report
    assert "cosine similarity" in message and not out.exists()


def test_a_dtype_a_target_cannot_hold_is_refused_before_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--to", "onnx", "--model", MLP_SPEC["model"], "--input", MLP_SPEC["inputs"][0]]
    code, report, _ = run_cli(
        [*args, "--dtype", "bfloat16", "-o", str(tmp_path / "m.onnx")], capsys
    )
    assert code == 4 and "onnx cannot hold --dtype bfloat16" in report["error"]["message"]
    assert report["error"]["hint"] == "onnx takes --dtype float32 or float16"
    assert not list(tmp_path.iterdir())


def test_dtype_on_a_generation_export_is_refused_before_work(
    llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [str(llama), "--to", "pt2", "--task", "text-generation-with-past", "--dtype", "float16"]
    code, report, _ = run_cli([*args, "-o", str(tmp_path / "g.pt2")], capsys)
    assert code == 4 and "--dtype float16 is not there yet" in report["error"]["message"]


def _echo_load(path: str, device: str) -> tuple[Any, list[str] | None, list[str]]:
    """An isolated runtime answering with its feeds, doubled (``isolated.Load``)."""

    def run(feeds: dict[str, Any]) -> list[Any]:
        return [torch.as_tensor(v) * 2 for v in feeds.values()]

    return run, None, [device]


def test_bfloat16_tensors_cross_an_isolated_runtimes_pipe(tmp_path: Path) -> None:
    """numpy has no bfloat16: the AOTI and ExecuTorch checks of a bfloat16 program failed
    "Got unsupported ScalarType BFloat16" before any call ran."""
    from ptconvert.formats.isolated import IsolatedRuntime

    runtime = IsolatedRuntime("echo", str(tmp_path), load=_echo_load)
    try:
        x = torch.randn(3, 5).to(torch.bfloat16)
        (y,) = runtime(x=x)
    finally:
        runtime.close()
    assert y.dtype == torch.bfloat16 and torch.equal(y, x * 2)


def test_a_bfloat16_executorch_program_is_checked_in_its_runtime(
    samples: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "mlp.pte"
    report = ptconvert.convert(
        samples["mlp_zip"],
        "pte",
        out,
        **MLP_SPEC,
        dtype="bfloat16",
        dynamic_batch=True,
        cache=False,
    )
    assert report.check == "parity" and report.accuracy is not None
    assert report.accuracy.status == "pass"
