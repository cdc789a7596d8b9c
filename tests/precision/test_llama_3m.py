"""Issue 41's measurements on a ~3 M-parameter Llama (``llama3m.py``), each program run by its
own runtime on inputs it was not exported with and compared with float32 eager: an fp16 ONNX is
at most 0.6× the float32 file and within 2 % (of the largest |logit|) in onnxruntime; a bf16
pt2 runs in a fresh interpreter (``torch.export.load(p).module()``) within 5 %. Slow: each
exports the model (the tiny Llama of test_dtype.py covers the same routes fast)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import ptconvert
from tests.precision.llama3m import build_llama_3m, float32_logits, sample_ids

pytestmark = pytest.mark.slow  # a 3.9 M-parameter Llama exported (~30 s an export)


@pytest.fixture(scope="module")
def llama3m(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_llama_3m(tmp_path_factory.mktemp("llama3m") / "llama")


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest error as a fraction of the largest |logit| of float32 eager."""
    return float((got.float() - want).abs().max() / want.abs().max())


def test_a_3m_llama_onnx_at_float16_is_at_most_0_6_of_float32_and_within_2_percent(
    llama3m: Path, tmp_path: Path
) -> None:
    import onnxruntime as ort

    full, half = tmp_path / "f.onnx", tmp_path / "h.onnx"
    ptconvert.convert(llama3m, "onnx", full, dynamic_batch=True, verify=False, cache=False)
    report = ptconvert.convert(
        llama3m, "onnx", half, dynamic_batch=True, dtype="float16", cache=False
    )
    assert report.accuracy is not None and report.accuracy.status == "pass"
    ratio = half.stat().st_size / full.stat().st_size
    assert ratio <= 0.6, ratio
    session = ort.InferenceSession(str(half), providers=["CPUExecutionProvider"])
    errors = []
    for rows in (1, 3):
        ids = sample_ids(rows)
        feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones_like(ids.numpy())}
        (logits,) = session.run(["logits"], feeds)
        assert logits.dtype == np.float16
        errors.append(_error(torch.from_numpy(logits), float32_logits(llama3m, ids)))
    assert max(errors) <= 0.02, errors
    print(f"measured: onnx float16 {ratio:.3f}× the float32 file, error {max(errors):.4%}")


# the fresh interpreter: the user's load, on ids it reads from a file, logits written back
_FRESH = """
import sys, torch
import transformers.modeling_outputs  # the output's pytree type, registered as a user would
program = torch.export.load(sys.argv[1]).module()
ids = torch.load(sys.argv[2])
with torch.no_grad():
    out = program(input_ids=ids, attention_mask=torch.ones_like(ids))
logits = out["logits"] if isinstance(out, dict) else out[0]
torch.save(logits, sys.argv[3])
"""


def test_a_3m_llama_pt2_at_bfloat16_runs_in_a_fresh_process_within_5_percent(
    llama3m: Path, tmp_path: Path
) -> None:
    out = tmp_path / "bf16.pt2"
    report = ptconvert.convert(
        llama3m, "pt2", out, dynamic_batch=True, dtype="bfloat16", cache=False
    )
    assert report.accuracy is not None and report.accuracy.status == "pass"
    errors = []
    for rows in (1, 3):
        ids, got = sample_ids(rows), tmp_path / f"logits{rows}.pt"
        torch.save(ids, tmp_path / "ids.pt")
        cmd = [sys.executable, "-c", _FRESH, str(out), str(tmp_path / "ids.pt"), str(got)]
        subprocess.run(cmd, check=True, timeout=300)
        logits = torch.load(got)
        assert logits.dtype == torch.bfloat16
        errors.append(_error(logits, float32_logits(llama3m, ids)))
    assert max(errors) <= 0.05, errors
    print(f"measured: pt2 bfloat16 error {max(errors):.4%}, {out.stat().st_size:,} bytes")
