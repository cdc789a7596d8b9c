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
    monkeypatch.setattr(write, "llama3_divisors", lambda rope, head_dim, base: [1.0] * 8)
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


# --- GGUF → Hugging Face: the scaling carried back into config.json ---------------------------


def logits(folder: Path, length: int = 19, **rope: Any) -> torch.Tensor:
    """The directory's model's logits on one prompt (``rope``: rope_parameters replaced)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    if rope:
        config.rope_parameters = rope
    model = AutoModelForCausalLM.from_pretrained(folder, config=config).eval()
    with torch.no_grad():
        return model(input_ids=torch.arange(length)[None] * 7 % 250).logits[0]


@pytest.mark.parametrize("rope", [LLAMA3_ROPE, LINEAR_ROPE], ids=["llama3", "linear"])
def test_a_scaled_gguf_converts_back_with_its_scaling(
    rope: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = build_decoder("llama", tmp_path / "tiny-llama", rope=rope)
    out = tmp_path / "tiny-llama.gguf"
    ptconvert.convert(source, "gguf", out)
    back = tmp_path / "back"
    code, report, _ = run_cli([str(out), "--to", "safetensors", "-o", str(back), "--json"], capsys)
    assert code == 0, report
    config = json.loads((back / "config.json").read_text())["rope_parameters"]
    assert {k: config[k] for k in rope} == rope  # the source's own parameters
    assert any("carried into config.json" in n for n in report["notes"])
    assert not any("left out" in n for n in report["notes"])  # rope_freqs is carried
    torch.testing.assert_close(logits(back), logits(source), rtol=1e-4, atol=1e-4)
    # the control: the same directory unscaled computes otherwise
    unscaled = logits(back, rope_type="default", rope_theta=10000.0)
    assert (unscaled - logits(source)).abs().max() > 1e-2


@pytest.mark.parametrize("factor", [2.0, 8.0, 32.0])
@pytest.mark.parametrize("head_dim", [16, 128])
@pytest.mark.parametrize("base", [1e4, 5e5])
def test_llama3_parameters_are_recovered_from_any_llama3_divisors(
    factor: float, head_dim: int, base: float
) -> None:
    """Whatever the context and frequency factors (so however many frequencies are smoothed:
    none, one, several), parameters are found that give the same divisors as float32 holds
    them; Llama 3.1's own come back as they are where several frequencies are smoothed (a
    128-wide head)."""
    from ptconvert.formats.gguf.rope import llama3_divisors, llama3_parameters

    for low, high, context in [(1.0, 4.0, 8192), (2.0, 8.0, 100), (3.0, 4.0, 64), (1.0, 4.0, 64)]:
        rope = {
            "factor": factor,
            "low_freq_factor": low,
            "high_freq_factor": high,
            "original_max_position_embeddings": context,
        }
        written = torch.tensor(llama3_divisors(rope, head_dim, base), dtype=torch.float32)
        found = llama3_parameters(written.tolist(), head_dim, base)
        assert found.get("rope_type") == "llama3", found
        again = torch.tensor(llama3_divisors(found, head_dim, base), dtype=torch.float64)
        torch.testing.assert_close(again, written.double(), rtol=1e-5, atol=0)
        if (low, context, head_dim) == (1.0, 8192, 128):  # several smoothed: determined
            assert found == {"rope_type": "llama3", **rope}


def test_a_scaling_that_is_not_carried_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """yarn in the file (transformers' GGUF loading would drop it silently), and divisors no
    llama3 parameters give: exit 4, nothing written."""
    from ptconvert.formats.gguf.edges import write

    source = build_decoder("llama", tmp_path / "tiny-llama", rope=LLAMA3_ROPE)
    monkeypatch.setattr(write, "llama3_divisors", lambda rope, head_dim, base: [1.0, 8.0] * 4)
    odd = tmp_path / "odd.gguf"
    ptconvert.convert(source, "gguf", odd, verify=False)
    plain = build_decoder("llama", tmp_path / "plain-llama")
    add = write.add_hyperparameters

    def yarn(writer: Any, *args: Any) -> None:
        add(writer, *args)
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)

    monkeypatch.setattr(write, "add_hyperparameters", yarn)
    yarned = tmp_path / "yarn.gguf"
    ptconvert.convert(plain, "gguf", yarned)
    for path, said in [(odd, "no linear or llama3 scaling"), (yarned, "rope scaling 'yarn'")]:
        back = tmp_path / f"back-{path.stem}"
        code, report, _ = run_cli([str(path), "--to", "safetensors", "-o", str(back)], capsys)
        assert code == 4 and not back.exists(), report
        assert said in report["error"]["message"]


def test_a_gguf_without_rope_converts_back_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """GPT-2 (learned positions, no rope_parameters in its config): nothing to carry."""
    source = build_decoder("gpt2", tmp_path / "tiny-gpt2")
    out = tmp_path / "tiny-gpt2.gguf"
    ptconvert.convert(source, "gguf", out)
    back = tmp_path / "back"
    code, report, _ = run_cli([str(out), "--to", "safetensors", "-o", str(back), "--json"], capsys)
    assert code == 0, report
    assert not any("rope" in n for n in report["notes"])


def test_llama3_without_an_original_context_takes_the_models_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """transformers' default for a missing original_max_position_embeddings is
    max_position_embeddings (64 here); Llama 3.1's 8192 would put every frequency unscaled."""
    source = build_decoder("llama", tmp_path / "tiny-llama", rope=LLAMA3_ROPE)
    config = json.loads((source / "config.json").read_text())
    del config["rope_parameters"]["original_max_position_embeddings"]  # as older files have it
    (source / "config.json").write_text(json.dumps(config))
    reader, _ = converted(source, tmp_path, capsys)
    [freqs] = [t for t in reader.tensors if t.name == "rope_freqs.weight"]
    torch.testing.assert_close(
        torch.from_numpy(freqs.data.astype("float64")), transformers_divisors(source), rtol=1e-5,
        atol=0,
    )  # fmt: skip


def llama_config() -> Any:
    import transformers as t

    return t.LlamaConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=1)


LINEAR_ENDS = {"rope_type": "linear", "factor": 2.0}


@pytest.mark.parametrize(
    ("metadata", "found", "carried"),
    [
        ({"llama.rope.scaling.type": "none"}, {}, None),
        ({"llama.rope.scaling.factor": 2.0}, {}, LINEAR_ENDS),  # llama.cpp: no type is linear
        ({"llama.rope.scaling.type": "none", "llama.rope.scaling.factor": 2.0}, {}, LINEAR_ENDS),
        ({"llama.rope.scale_linear": 2.0}, {}, LINEAR_ENDS),  # llama.cpp's older key
        ({}, {"rope_freqs.weight": [1.0] * 8}, None),  # every divisor 1: unscaled
    ],
)
def test_what_llama_cpp_would_run_is_what_config_json_says(
    metadata: dict[str, Any], found: dict[str, list[float]], carried: dict[str, Any] | None
) -> None:
    from ptconvert.formats.gguf.rope import rope_of_file

    config = llama_config()
    before = dict(config.rope_parameters)
    rope_of_file(Path("x.gguf"), {"general.architecture": "llama", **metadata}, found, config)
    if carried is None:
        assert config.rope_parameters == before
    else:
        assert config.rope_parameters == {**before, **carried}


@pytest.mark.parametrize(
    ("metadata", "found", "said"),
    [
        ({"llama.rope.scaling.type": "yarn"}, {}, "rope scaling 'yarn'"),
        ({}, {"rope_factors_long.weight": [1.0] * 8}, "longrope"),
        ({"llama.rope.scaling.factor": 2.0}, {"rope_freqs.weight": [1.0] * 8}, "both"),
        ({}, {"rope_freqs.weight": []}, "no linear or llama3"),
        ({}, {"rope_freqs.weight": [0.0] * 8}, "no linear or llama3"),
        ({}, {"rope_freqs.weight": [1.0, 3.0, 3.0, 3.0, 8.0, 8.0, 8.0, 8.0]}, "no linear or"),
        ({}, {"rope_freqs.weight": [1.0, 8.0] * 4}, "no linear or llama3"),
    ],
)
def test_a_scaling_llama_cpp_would_run_and_transformers_drop_is_refused(
    metadata: dict[str, Any], found: dict[str, list[float]], said: str
) -> None:
    from ptconvert.errors import UnsupportedConversionError
    from ptconvert.formats.gguf.rope import rope_of_file

    config = llama_config()
    before = dict(config.rope_parameters)
    with pytest.raises(UnsupportedConversionError, match=said):
        rope_of_file(Path("x.gguf"), {"general.architecture": "llama", **metadata}, found, config)
    assert config.rope_parameters == before


def test_a_scaling_transformers_read_itself_is_left_as_read() -> None:
    """gpt-oss: transformers' GGUF loading rebuilds its yarn from the keys."""
    from ptconvert.formats.gguf.rope import rope_of_file

    config = llama_config()
    config.rope_parameters = {**config.rope_parameters, "rope_type": "yarn", "factor": 32.0}
    before = dict(config.rope_parameters)
    meta = {"general.architecture": "gpt-oss", "gpt-oss.rope.scaling.type": "yarn"}
    assert rope_of_file(Path("x.gguf"), meta, {}, config) == ""
    assert config.rope_parameters == before
