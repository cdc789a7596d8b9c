"""Whisper (``--task automatic-speech-recognition-with-past``) as a folder of an encoder taking
``input_features`` (mel bins × fixed frames, batch dynamic) and a decoder without a mask,
generated with by the test's own loops (test_seq2seq's: ``torch.export.load`` for pt2,
onnxruntime for ONNX) from the decoder's start token, token for token and logit for logit
against transformers' ``generate`` with a bare generation config (no forced decoder ids, no
timestamps, no suppressed tokens), at batch 1 and 2 on two different feature inputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch

import ptconvert
from ptconvert.cli import main
from tests.generation.test_seq2seq import (
    assert_generates_as_transformers,
    assert_merged_decoder,
    eager,
    merged_loop,
    onnx_loop,
    pt2_loop,
    reference,
)

TASK = "automatic-speech-recognition-with-past"
MELS, FRAMES = 16, 64  # conftest's tiny Whisper: num_mel_bins, 2 × max_source_positions


def features(rows: int, which: int) -> torch.Tensor:
    """Feature input ``which`` (1 or 2) of ``rows`` rows: different draws, one shape."""
    return torch.randn((rows, MELS, FRAMES), generator=torch.Generator().manual_seed(which))


def test_the_reference_is_the_plain_greedy_loop(tiny_whisper: Path) -> None:
    """Whisper's own ``generate`` given the bare config adds no logits processor: its logits are
    the model's forward on the tokens it chose (apples to apples with the artifact's loop)."""
    model = eager(tiny_whisper)
    ids = features(2, 1)
    want = reference(model, ids, 8)
    with torch.no_grad():
        states = model.get_encoder()(input_features=ids)[0]
        logits = model(encoder_outputs=(states,), decoder_input_ids=want.sequences[:, :-1]).logits
    for k, step in enumerate(want.logits):
        torch.testing.assert_close(step, logits[:, k], atol=1e-4, rtol=1e-4)
    assert (want.sequences[:, 0] == model.generation_config.decoder_start_token_id).all()


def test_whisper_pt2_folder_unchecked_generates_with_its_own_loop(
    tiny_whisper: Path, tmp_path: Path
) -> None:
    """The fast one: written without the check, generated with by the test's loop alone."""
    out = tmp_path / "whisper-pt2"
    args = [str(tiny_whisper), "--to", "pt2", "--task", TASK, "-o", str(out), "--no-verify"]
    assert main([*args, "--cache-length", "20", "-q"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "decoder.pt2", "encoder.pt2", "generation_config.json"
    ]  # fmt: skip
    model = eager(tiny_whisper)
    distinct: set[int] = set()
    for rows in (1, 2):
        for which in (1, 2):
            ids = features(rows, which)
            want = reference(model, ids)
            got, logits = pt2_loop(out, ids, 16)
            assert torch.equal(got, want.sequences[:, 1:]), (rows, which)
            for ours, theirs in zip(logits, want.logits, strict=True):
                torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
            distinct |= set(got.flatten().tolist())
    assert len(distinct) > 3  # the tiny model does not repeat one token: the test can fail
    info = ptconvert.describe(out)
    assert (info.format, info.layout) == ("hf", "seq2seq-pt2")
    assert info.metadata["task"] == TASK
    assert info.metadata["cache"].startswith("static, batch 2, 20 positions")
    assert info.metadata["encoder.pt2"].split(": ")[1].startswith("input_features →")


@pytest.mark.slow
def test_whisper_to_an_onnx_folder_under_optimums_names(
    tiny_whisper: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", str(tiny_whisper), "--to", "onnx", "--task", TASK, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["task"] == TASK and plan["runnable"] and "greedy tokens" in plan["check"]
    said = " ".join(s["what"] for s in plan["steps"])
    assert "a speech-seq2seq model" in said and "encoder_model.onnx" in said
    out = tmp_path / "whisper-onnx"
    report = ptconvert.convert(tiny_whisper, "onnx", out, task=TASK)
    assert report.generation is not None and report.check == "generation"
    assert report.generation.cache["layers"] == 2
    assert [(r.batch, r.prompt_length) for r in report.generation.check.runs] == [
        (1, 1), (1, 2), (2, 1), (2, 2)
    ]  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "decoder_model.onnx", "decoder_model_merged.onnx",
        "decoder_with_past_model.onnx", "encoder_model.onnx", "generation_config.json",
    ]  # fmt: skip
    assert_merged_decoder(out)
    assert any("decoder_model_merged.onnx: both branches" in n for n in report.notes)

    def dims(name: str) -> dict[str, list[Any]]:
        graph = onnx.load(str(out / name)).graph
        return {
            v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*graph.input, *graph.output]
        }

    encoder, first, later = (
        dims(n)
        for n in ("encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx")
    )
    assert encoder == {
        "input_features": ["batch_size", MELS, FRAMES],
        "last_hidden_state": ["batch_size", FRAMES // 2, 32],
    }
    assert list(first)[:3] == ["input_ids", "encoder_hidden_states", "logits"]
    assert first["present.1.encoder.key"] == ["batch_size", 4, FRAMES // 2, 8]
    assert first["present.0.decoder.value"] == ["batch_size", 4, "decoder_sequence_length", 8]
    assert later["past_key_values.0.encoder.value"] == ["batch_size", 4, FRAMES // 2, 8]
    assert later["present.1.decoder.key"] == [
        "batch_size", 4, "past_decoder_sequence_length + decoder_sequence_length", 8
    ]  # fmt: skip
    assert "encoder_attention_mask" not in {**first, **later}
    assert ptconvert.describe(out).metadata["task"] == TASK
    assert_generates_as_transformers(tiny_whisper, out, onnx_loop, features, (1, 2))
    assert_generates_as_transformers(tiny_whisper, out, merged_loop, features, (1, 2))
    assert torch.equal(
        ptconvert.generate(out, features(2, 3), max_new_tokens=8).sequences,
        reference(eager(tiny_whisper), features(2, 3), 8).sequences,
    )


@pytest.mark.slow
def test_whisper_to_a_checked_pt2_folder(
    tiny_whisper: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "whisper-pt2"
    report = ptconvert.convert(tiny_whisper, "pt2", out, task=TASK)
    assert report.generation is not None and report.generation.check.status == "pass"
    assert report.generation.cache == {"kind": "static", "batch_size": 2, "length": 48}
    assert "input_features[batch, 16, 64]" in report.interface["call"]
    assert_generates_as_transformers(tiny_whisper, out, pt2_loop, features, (1, 2))
    # the public runner takes the folder and the features; others are a usage error
    done = ptconvert.generate(out, features(1, 3), max_new_tokens=4)
    assert torch.equal(done.sequences, reference(eager(tiny_whisper), features(1, 3), 4).sequences)
    with pytest.raises(ptconvert.UsageError, match="16 mel bins × 64 frames"):
        ptconvert.generate(out, torch.zeros((1, MELS, 30)), max_new_tokens=4)
    with pytest.raises(ptconvert.UsageError, match="input_features is batch × mel bins"):
        ptconvert.generate(out, [[1, 2, 3]], max_new_tokens=4)
    # bench in its generation mode: random features of the folder's shape, eager generate
    capsys.readouterr()
    args = ["bench", str(out), "--reference", str(tiny_whisper), "--compile-mode", "none"]
    args += ["--new-tokens", "3", "--repeats", "1", "--warmup", "0", "--batch-sizes", "1,2"]
    assert main([*args, "--json"]) == 0
    timed = json.loads(capsys.readouterr().out)
    assert timed["task"] == TASK and timed["prompt_length"] == 0
    assert {(t["runtime"], t["batch"]) for t in timed["tokens"]} == {
        (r, b) for r in ("eager", "artifact") for b in (1, 2)
    }
