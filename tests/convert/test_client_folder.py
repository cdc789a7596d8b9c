"""Issue 40: a Hugging Face directory to ONNX (the graph route) is written as the folder
optimum's ``ORTModelFor<Task>.from_pretrained`` loads: ``model.onnx`` beside the directory's
kept files, batch and sequence dynamic; ``-o x.onnx`` still writes one file and says what a
client misses; ``info``, ``verify`` and ``bench`` take the folder (the clients' own test:
tests/clients/test_optimum.py)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
import torch

import ptconvert
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BertForSequenceClassification (two token types) with a tokenizer file beside."""
    import transformers as t

    config = t.BertConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=37,
        num_labels=3,
    )
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("models") / "hf-bert"
    t.BertForSequenceClassification(config).eval().save_pretrained(directory)
    (directory / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 512}))
    return directory


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_default_output_is_optimums_folder_beside_the_source(bert: Path) -> None:
    report = ptconvert.convert(bert, "onnx")
    folder = bert.with_name("hf-bert-onnx")
    assert report.output == str(folder) and report.check == "parity"
    assert files(folder) == ["config.json", "model.onnx", "tokenizer_config.json"]
    assert any("model.onnx beside config.json, tokenizer_config.json" in n for n in report.notes)
    assert any("--dynamic-batch implied" in n for n in report.notes), report.notes
    # the load line loads the folder (it named the folder as if it were the graph)
    assert "ORTModelFor<Task>.from_pretrained(p)" in report.interface["load"]
    graph = onnx.load(folder / "model.onnx").graph
    dims = {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*graph.input, *graph.output]
    }
    sequence = ["batch_size", "sequence_length"]
    assert dims == {
        "input_ids": sequence,
        "attention_mask": sequence,
        "token_type_ids": sequence,
        "logits": ["batch_size", 3],
    }
    info = ptconvert.describe(folder)
    assert (info.format, info.layout, info.path) == ("onnx", "folder", str(folder))
    assert [i.name for i in info.inputs or []] == ["input_ids", "attention_mask", "token_type_ids"]
    assert {Path(f["path"]).name for f in info.files} == set(files(folder))
    checked = ptconvert.verify(bert, folder)
    assert checked.status == "pass" and checked.inputs_fed == [
        "input_ids",
        "attention_mask",
        "token_type_ids",
    ], checked


def test_o_names_the_folder_or_one_file(
    bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-o DIR/ and -o OUT (no suffix) are the folder; -o x.onnx one file, and a note."""
    for out in (f"{tmp_path / 'dir'}/", str(tmp_path / "out")):
        code, report, _ = run_cli([str(bert), "--to", "onnx", "-o", out, "--no-verify"], capsys)
        folder = Path(out)
        assert code == 0 and report["output"] == str(folder), report
        assert files(folder) == ["config.json", "model.onnx", "tokenizer_config.json"]
    one = tmp_path / "one.onnx"
    code, report, _ = run_cli([str(bert), "--to", "onnx", "-o", str(one), "--no-verify"], capsys)
    assert code == 0 and one.is_file() and report["output"] == str(one), report
    assert files(tmp_path) == ["dir", "one.onnx", "out"]
    note = next(n for n in report["notes"] if n.startswith("one onnx file, as -o names it"))
    assert "optimum's ORTModelFor<Task>.from_pretrained loads a folder (model.onnx" in note
    assert note.endswith("-o DIR/ writes it")
