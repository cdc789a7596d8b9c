"""GGUF → safetensors / pt: plain tensors copied as byte ranges, quantized ones dequantized by the
gguf package; a file transformers loads from GGUF becomes the Hugging Face directory that loading
amounts to (its logits those of transformers' own GGUF loading, bit for bit). Outputs are read
back with safetensors' safe_open and compared with the gguf package's GGUFReader."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from tests.conftest import run_cli
from tests.formats.test_gguf import FIXTURES, mixed_tensors, write_gguf

gguf = pytest.importorskip("gguf")

LLAMAS = ("tiny-llama-f16.gguf", "tiny-llama-q8_0.gguf")


def reader_tensors(path: Path) -> dict[str, torch.Tensor]:
    """GGUFReader's tensors in torch order: plain types as stored, quantized ones dequantized."""
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if t.tensor_type == gguf.GGMLQuantizationType.BF16:
            bits = torch.from_numpy(np.ascontiguousarray(t.data).view(np.int16).copy())
            out[t.name] = bits.view(torch.bfloat16).reshape(shape)
        elif t.data.dtype == np.uint8:  # quantized blocks
            data = gguf.quants.dequantize(t.data, t.tensor_type)
            out[t.name] = torch.from_numpy(np.ascontiguousarray(data)).reshape(shape)
        else:
            out[t.name] = torch.from_numpy(np.array(t.data)).reshape(shape)
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype and a.shape == b.shape and a.view(torch.uint8).equal(b.view(torch.uint8))
    )


def test_an_unknown_architecture_keeps_the_gguf_names_bit_for_bit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_gguf(tmp_path / "mixed.gguf", mixed_tensors())
    code, report, _ = run_cli([str(src), "--to", "safetensors"], capsys)
    assert code == 0, report
    out = tmp_path / "mixed.safetensors"
    assert report["output"] == str(out) and report["weights"]["verification"]["status"] == "pass"
    assert report["weights"]["verification"]["reader"].startswith("gguf.GGUFReader")
    notes = " ".join(report["notes"])
    assert "tensors under the GGUF's own names" in notes
    assert "8 tensors copied as byte ranges" in notes
    assert "dequantized 3 tensors of types Q4_0 (1), Q4_K (1), Q8_0 (1) into float32" in notes
    expected = reader_tensors(src)
    with safe_open(out, "pt") as f:
        assert set(f.keys()) == set(expected)
        for name, want in expected.items():
            got = f.get_tensor(name)
            assert same_bits(got, want), name
        meta = f.metadata()
    assert meta["general.architecture"] == "testarch"
    assert meta["test.string"] == "héllo, GGUF" and meta["test.bool"] == "true"
    assert meta["test.u64"] == str(2**60) and "test.ints" not in meta  # scalars only
    assert reader_tensors(src)["w.q8_0"].dtype == torch.float32


def test_to_pt_is_a_state_dict_torch_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_gguf(tmp_path / "mixed.gguf", mixed_tensors())
    code, report, _ = run_cli([str(src), "--to", "pt"], capsys)
    assert code == 0, report
    state = torch.load(tmp_path / "mixed.pt", weights_only=True)
    expected = reader_tensors(src)
    assert set(state) == set(expected)
    assert all(same_bits(state[n], t) for n, t in expected.items())


def test_plain_types_need_no_gguf_package_to_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = {
        k: v for k, v in mixed_tensors().items() if v[1] in (None, gguf.GGMLQuantizationType.BF16)
    }
    src = write_gguf(tmp_path / "plain.gguf", plain)
    expected = reader_tensors(src)
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if it were not installed
    code, report, _ = run_cli([str(src), "--to", "safetensors", "--no-verify"], capsys)
    assert code == 0, report
    assert report["weights"]["path"] == "fast" and report["check"] == "none"
    with safe_open(tmp_path / "plain.safetensors", "pt") as f:
        assert all(same_bits(f.get_tensor(n), t) for n, t in expected.items())
    # the check's independent reader is the gguf package's
    code, report, _ = run_cli([str(src), "--to", "safetensors", "-o", str(tmp_path / "b")], capsys)
    assert code == 5 and report["error"]["type"] == "MissingRequirementError"
    assert "pip install -e '.[gguf]'" in report["error"]["hint"]
    assert "--no-verify" in report["error"]["hint"]


def test_quantized_tensors_without_the_extra_name_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_gguf(tmp_path / "mixed.gguf", mixed_tensors())
    monkeypatch.setitem(sys.modules, "gguf", None)
    code, report, _ = run_cli([str(src), "--to", "safetensors"], capsys)
    assert code == 5 and report["error"]["type"] == "MissingRequirementError"
    assert "'gguf'" in report["error"]["message"]
    assert "pip install -e '.[gguf]'" in report["error"]["hint"]
    assert not (tmp_path / "mixed.safetensors").exists()


def test_a_truncated_gguf_is_an_input_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "cut.gguf"
    src.write_bytes((FIXTURES / LLAMAS[0]).read_bytes()[:-1000])
    code, report, _ = run_cli([str(src), "--to", "safetensors"], capsys)
    assert code == 3 and report["error"]["path"] == str(src)  # the scan, run first, says it
    assert "the file is truncated" in report["error"]["message"]
    assert not list(tmp_path.glob("cut-*")) and not (tmp_path / "cut.safetensors").exists()


def _logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.tensor([[1, 5, 9, 20, 33, 100, 252], [1, 7, 7, 7, 2, 0, 3]])
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("name", LLAMAS)
def test_a_llama_becomes_the_directory_transformers_loading_amounts_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    src = tmp_path / name
    shutil.copy(FIXTURES / name, src)
    code, report, _ = run_cli([str(src), "--to", "safetensors"], capsys)
    assert code == 0, report
    out = tmp_path / f"{name.split('.')[0]}-safetensors"
    assert report["output"] == str(out) and report["weights"]["verification"]["status"] == "pass"
    assert report["weights"]["verification"]["reader"].startswith(
        "transformers' load_gguf_checkpoint"
    )
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    notes = " ".join(report["notes"])
    assert "names mapped for architecture llama" in notes
    assert "4 tensors processed as transformers processes them" in notes  # q and k, 2 layers
    if "q8_0" in name:
        assert "dequantized 16 tensors of types Q8_0 (16) into float32" in notes
    else:
        assert "17 tensors copied as byte ranges" in notes
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]

    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=name)
    ours = AutoModelForCausalLM.from_pretrained(out)
    assert torch.equal(_logits(ours), _logits(theirs))
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(ours.config)
    loaded = load_gguf_checkpoint(str(src), return_tensors=True, model_to_load=skeleton)
    with safe_open(out / "model.safetensors", "pt") as f:
        assert set(f.keys()) == set(loaded["tensors"])
        for key, want in loaded["tensors"].items():  # the file's half type where it is exact
            assert torch.equal(f.get_tensor(key).to(torch.float32), want), key


def test_a_llama_to_pt_is_a_directory_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModelForCausalLM

    src = tmp_path / LLAMAS[1]
    shutil.copy(FIXTURES / LLAMAS[1], src)
    code, report, _ = run_cli([str(src), "--to", "pt"], capsys)
    assert code == 0, report
    out = tmp_path / "tiny-llama-q8_0-pt"
    assert (out / "pytorch_model.bin").is_file() and (out / "config.json").is_file()
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=src.name)
    ours = AutoModelForCausalLM.from_pretrained(out)
    assert torch.equal(_logits(ours), _logits(theirs))


def test_without_transformers_the_gguf_names_are_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "llama.gguf"
    shutil.copy(FIXTURES / LLAMAS[0], src)
    monkeypatch.setitem(sys.modules, "transformers", None)
    code, report, _ = run_cli([str(src), "--to", "safetensors"], capsys)
    assert code == 0, report
    assert report["output"] == str(tmp_path / "llama.safetensors")
    assert "transformers is not installed" in " ".join(report["notes"])
    with safe_open(tmp_path / "llama.safetensors", "pt") as f:
        assert "blk.0.attn_q.weight" in f.keys()  # noqa: SIM118 (not a mapping)
        assert f.metadata()["general.architecture"] == "llama"


def as_bf16(src: Path, dst: Path) -> Path:
    """``src`` written again by GGUFWriter with its F16 tensors in BF16 (metadata as it is)."""
    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch=reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for t in reader.tensors:
        data = np.array(t.data)
        if t.tensor_type == gguf.GGMLQuantizationType.F16:
            w.add_tensor(
                t.name,
                gguf.quants.quantize(data.astype(np.float32), gguf.GGMLQuantizationType.BF16),
                raw_dtype=gguf.GGMLQuantizationType.BF16,
            )
        else:
            w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_a_bf16_llama_keeps_bfloat16_where_it_is_exact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The q/k projections transformers permutes (in float32) stay bfloat16: the permutation
    moves values, it makes none; the others are byte ranges."""
    from transformers import AutoModelForCausalLM

    src = as_bf16(FIXTURES / LLAMAS[0], tmp_path / "bf16.gguf")
    code, report, _ = run_cli([str(src), "--to", "safetensors"], capsys)
    assert code == 0, report
    out = tmp_path / "bf16-safetensors"
    assert "17 tensors copied as byte ranges" in " ".join(report["notes"])
    with safe_open(out / "model.safetensors", "pt") as f:
        assert f.get_tensor("model.layers.0.self_attn.q_proj.weight").dtype == torch.bfloat16
        assert f.get_tensor("model.norm.weight").dtype == torch.float32
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=src.name)
    ours = AutoModelForCausalLM.from_pretrained(out)
    assert torch.equal(_logits(ours), _logits(theirs))
