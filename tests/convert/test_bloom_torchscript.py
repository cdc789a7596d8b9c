"""BLOOM → TorchScript: its GeLU is an autograd.Function (``GeLUFunction``, the training branch
the script and the trace both keep), which torch.jit.save refuses. It exited 1, "internal
error"; it is unsupported content (exit 4), one line with a hint (issue 43)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ptconvert.errors import UnsupportedConversionError
from tests.conftest import run_cli


def test_bloom_to_torchscript_is_a_named_refusal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import transformers as t

    config = t.BloomConfig(vocab_size=99, hidden_size=32, n_layer=1, n_head=4)
    t.BloomForCausalLM(config).eval().save_pretrained(tmp_path / "bloom")
    out = tmp_path / "bloom.ts"
    code, report, _ = run_cli(
        [str(tmp_path / "bloom"), "--to", "torchscript", "-o", str(out)], capsys
    )
    assert code == UnsupportedConversionError.exit_code, report
    error = report["error"]
    assert "GeLUFunction" in error["message"] and "\n" not in error["message"], error
    assert "pt2" in error["hint"] and not out.exists()
