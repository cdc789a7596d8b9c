"""--to gguf of a scaled rope, as llama.cpp's converter writes it: Llama 3's as a rope_freqs
tensor of per-frequency divisors, linear as the rope.scaling keys. Each file is read back here
and its divisors compared with what transformers' own rope code computes for the source; the
check refuses divisors written wrong; a scaling llama.cpp's architecture cannot hold is refused
before any work. llama.cpp runs these files in tests/clients/test_llama_cpp.py."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import ptconvert
from ptconvert.errors import VerificationError
from tests.conftest import run_cli
from tests.formats.gguf_target_models import LINEAR_ROPE, LLAMA3_ROPE, build_decoder

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")


def transformers_divisors(folder: Path) -> torch.Tensor:
    """Per frequency, the unscaled inverse frequency over the one transformers rotates by."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = AutoConfig.from_pretrained(folder)
    scaled, attention = ROPE_INIT_FUNCTIONS[config.rope_parameters["rope_type"]](config, None)
    assert attention == 1.0
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    plain = 1.0 / config.rope_parameters["rope_theta"] ** (torch.arange(0, d, 2).double() / d)
    return plain / scaled.double()


def converted(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    out = tmp_path / f"{source.name}.gguf"
    code, report, _ = run_cli([str(source), "--to", "gguf", "-o", str(out), "--json"], capsys)
    assert code == 0, report
    assert any("transformers' GGUF loading gives the source" in n for n in report["notes"])
    return gguf.GGUFReader(out), report


def key(reader: Any, name: str) -> Any:
    found = reader.get_field(name)
    return None if found is None else found.contents()


def test_llama3_rope_is_written_as_the_divisors_transformers_scales_by(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = build_decoder("llama", tmp_path / "tiny-llama", rope=LLAMA3_ROPE)
    reader, report = converted(source, tmp_path, capsys)
    [freqs] = [t for t in reader.tensors if t.name == "rope_freqs.weight"]
    assert freqs.tensor_type.name == "F32"
    written = torch.from_numpy(freqs.data.astype("float64"))
    want = transformers_divisors(source)
    torch.testing.assert_close(written, want, rtol=1e-5, atol=0)
    # each of Llama 3's ranges is in this model: unscaled, smoothed, divided by the factor
    assert written[0] == 1.0 and 1.0 < written[1] < 8.0 and written[-1] == 8.0
    assert key(reader, "llama.rope.scaling.type") is None  # llama.cpp's converter writes none
    assert any("rope scaling llama3 read back as rope_freqs" in n for n in report["notes"])


@pytest.mark.parametrize(
    ("kind", "rope"),
    [
        ("llama", LINEAR_ROPE),
        ("qwen2", LINEAR_ROPE),
        # transformers 4's spelling: rope_scaling with "type", rope_theta beside it
        ("llama", {"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_theta": 10000.0}),
    ],
)
def test_linear_rope_is_written_as_the_scaling_keys(
    kind: str, rope: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = build_decoder(kind, tmp_path / f"tiny-{kind}")
    config = json.loads((source / "config.json").read_text())
    if "rope_type" in rope:
        config["rope_parameters"] = rope
    else:
        config.pop("rope_parameters")
        config.update(rope)
    (source / "config.json").write_text(json.dumps(config))
    reader, report = converted(source, tmp_path, capsys)
    arch = kind
    factor = float(transformers_divisors(source)[0])
    assert factor == (rope.get("factor") or rope["rope_scaling"]["factor"])
    assert key(reader, f"{arch}.rope.scaling.type") == "linear"
    assert math.isclose(key(reader, f"{arch}.rope.scaling.factor"), factor)
    assert not [t for t in reader.tensors if t.name == "rope_freqs.weight"]
    assert any("rope scaling linear read back" in n for n in report["notes"])


def test_divisors_written_wrong_are_refused_by_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ptconvert.formats.gguf.edges import write

    source = build_decoder("llama", tmp_path / "tiny-llama", rope=LLAMA3_ROPE)
    monkeypatch.setattr(write, "llama3_rope_factors", lambda config, hyper: [1.0] * 8)
    out = tmp_path / "wrong.gguf"
    with pytest.raises(VerificationError, match="other frequencies than transformers' llama3"):
        ptconvert.convert(source, "gguf", out)
    assert not out.exists()


def test_a_scaling_llama_cpp_cannot_hold_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Llama 3's divisors on Qwen2 (llama.cpp's qwen2 reads no rope_freqs)."""
    source = build_decoder("qwen2", tmp_path / "tiny-qwen2", rope=LLAMA3_ROPE)
    out = tmp_path / "refused.gguf"
    code, report, _ = run_cli([str(source), "--to", "gguf", "-o", str(out)], capsys)
    assert code == 4 and not out.exists(), report
    assert "rope_freqs for llama alone" in report["error"]["message"]
