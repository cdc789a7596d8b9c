"""optimum's ORTModel classes load what ``--to onnx`` writes, as written (ort_client.py in the
clients' venv: optimum-onnx 0.1.0, transformers 4.57.6), and generate or classify exactly as
transformers' eager model does here (transformers 5.x: the reference); a seq2seq folder's
decoder is the merged one, optimum's default (``decoder_model_merged.onnx``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
import torch

import ptconvert
from tests.clients.conftest import (
    eager_classifier,
    eager_image_classifier,
    ort_client,
    ort_opened,
    tiny_bert_classifier,
    tiny_vit_classifier,
)
from tests.generation import conftest as decoders
from tests.generation import test_seq2seq as seq2seq
from tests.generation.conftest import build

pytestmark = pytest.mark.clients


def distinct(tokens: torch.Tensor) -> int:
    return len(set(tokens.flatten().tolist()))


def test_t5_onnx_folder_generates_in_ortmodel_for_seq2seq_lm(
    client_python: Path, tmp_path: Path
) -> None:
    source = build("t5", tmp_path)
    out = tmp_path / "t5-onnx"
    ptconvert.convert(source, "onnx", out, task="text2text-generation-with-past")
    ids = seq2seq.token_prompt(2, 7)
    new_tokens = 10
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "new_tokens": new_tokens}
    got = ort_client(client_python, "ORTModelForSeq2SeqLM", out, inputs, tmp_path)
    want = seq2seq.reference(seq2seq.eager(source), ids, new_tokens).sequences
    assert distinct(want[:, 1:]) > 2
    assert torch.equal(got, want)
    assert_ran_the_merged_decoder(ort_opened("ORTModelForSeq2SeqLM", tmp_path), new_tokens)


def assert_ran_the_merged_decoder(opened: dict[str, Any], new_tokens: int) -> None:
    """optimum opened decoder_model_merged.onnx (its default where it is there) and no split
    decoder, and ran its no-past branch once, then the with-past one each later token; it did
    not say a file was missing."""
    assert opened["decoder"] == "decoder_model_merged.onnx" and opened["is_merged"], opened
    assert "decoder_with_past" not in opened, opened
    assert opened["use_cache_branch"] == [False] + [True] * (new_tokens - 1)
    assert "decoder_model_merged" not in opened["stderr"], opened["stderr"]


def test_whisper_onnx_folder_generates_in_ortmodel_for_speech_seq2seq(
    client_python: Path, tmp_path: Path
) -> None:
    """transformers 4.57's Whisper ``generate`` (which optimum's class inherits) returns the
    tokens after the decoder's start token; 5.x's, the reference, starts with it."""
    source = build("whisper", tmp_path)
    out = tmp_path / "whisper-onnx"
    ptconvert.convert(source, "onnx", out, task="automatic-speech-recognition-with-past")
    features = torch.randn((2, 16, 64), generator=torch.Generator().manual_seed(1))
    new_tokens = 10
    inputs = {"input_features": features, "new_tokens": new_tokens}
    got = ort_client(client_python, "ORTModelForSpeechSeq2Seq", out, inputs, tmp_path)
    model = seq2seq.eager(source)
    want = seq2seq.reference(model, features, new_tokens).sequences
    assert (want[:, 0] == model.generation_config.decoder_start_token_id).all()
    assert distinct(want[:, 1:]) > 2
    assert torch.equal(got, want[:, 1:])
    assert_ran_the_merged_decoder(ort_opened("ORTModelForSpeechSeq2Seq", tmp_path), new_tokens)


# issue 40: -o OUT wrote one bare .onnx file at OUT, which ORTModelForCausalLM took for a hub
# id; now it is optimum's folder (model.onnx beside config.json, generation_config.json)
# (and a decoder TorchScript's exporter traced with its cache, as optimum-cli exports it)
@pytest.mark.parametrize(
    ("family", "exporter"),
    [("gpt2", "dynamo"), ("llama", "dynamo"), ("gpt2", "torchscript"), ("llama", "torchscript")],
)
def test_causal_lm_onnx_generates_in_ortmodel_for_causal_lm(
    family: str, exporter: str, client_python: Path, tmp_path: Path
) -> None:
    source = build(family, tmp_path)
    out = tmp_path / f"{family}-onnx"
    ptconvert.convert(source, "onnx", out, task="text-generation-with-past", onnx_exporter=exporter)
    model = decoders.eager(source)
    for rows in (1, 2):
        ids = torch.randint(3, 98, (rows, 5), generator=torch.Generator().manual_seed(7))
        new_tokens = 12
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        inputs["new_tokens"] = new_tokens
        got = ort_client(client_python, "ORTModelForCausalLM", out, inputs, tmp_path)
        want = decoders.reference(model, ids, new_tokens).sequences
        assert distinct(want[:, 5:]) > 2
        assert torch.equal(got, want), rows


def sentence_pairs() -> dict[str, torch.Tensor]:
    """Two pairs: the second sentence's tokens are type 1; the second row padded."""
    ids = torch.randint(3, 98, (2, 9), generator=torch.Generator().manual_seed(3))
    types = torch.tensor([[0] * 4 + [1] * 5, [0] * 3 + [1] * 6])
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


# issue 40: `--to onnx` of a classifier wrote one bare .onnx file (no config.json), which
# ORTModelForSequenceClassification took for a hub id; now it is optimum's folder, its graph
# taking BERT's token_type_ids, batch and sequence dynamic
# and as TorchScript's exporter writes it (--onnx-exporter torchscript, optimum-cli's own)
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_bert_classifier_onnx_matches_eager_on_sentence_pairs_in_ortmodel(
    client_python: Path, tmp_path: Path, exporter: str
) -> None:
    source = tiny_bert_classifier(tmp_path)
    out = tmp_path / "bert-cls-onnx"
    report = ptconvert.convert(source, "onnx", out, onnx_exporter=exporter)
    steps = [s.step for s in report.steps]
    assert ("onnx_trace_export" in steps) == (exporter == "torchscript") != ("export" in steps)
    graph = onnx.load(out / "model.onnx").graph
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [o.name for o in graph.output] == ["logits"]
    inputs = sentence_pairs()  # length 9: not the example's
    got = ort_client(client_python, "ORTModelForSequenceClassification", out, inputs, tmp_path)
    with torch.no_grad():
        want = eager_classifier(source)(**inputs).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_vit_image_classifier_onnx_matches_eager_in_ortmodel(
    client_python: Path, tmp_path: Path
) -> None:
    """Its folder holds the preprocessor's config, as optimum's folder does."""
    source = tiny_vit_classifier(tmp_path)
    out = tmp_path / "vit-cls-onnx"
    ptconvert.convert(source, "onnx", out)
    assert {"model.onnx", "config.json", "preprocessor_config.json"} <= {
        p.name for p in out.iterdir()
    }
    graph = onnx.load(out / "model.onnx").graph
    assert [i.name for i in graph.input] == ["pixel_values"]
    assert [o.name for o in graph.output] == ["logits"]
    model = eager_image_classifier(source)
    for rows in (1, 2):
        pixels = torch.randn((rows, 3, 32, 32), generator=torch.Generator().manual_seed(rows))
        inputs = {"pixel_values": pixels}
        got = ort_client(client_python, "ORTModelForImageClassification", out, inputs, tmp_path)
        with torch.no_grad():
            want = model(**inputs).logits
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
