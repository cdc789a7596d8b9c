"""Seq2seq LMs (T5, BART, Marian) as a folder of an encoder and a decoder: converted, then
generated with by loops of the test's own (``torch.export.load`` for pt2, onnxruntime for
ONNX: the encoder once, then the decoder a token a step from the start token), token for token
and logit for logit against transformers' ``generate``. The loops also take a speech model's
``input_features`` (float, 3-D: Whisper's encoder, its decoder without a mask;
test_whisper.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import ptconvert
from ptconvert.cli import main

TASK = "text2text-generation-with-past"


def eager(directory: Path) -> Any:
    import transformers

    speech = transformers.AutoConfig.from_pretrained(directory).model_type == "whisper"
    auto = transformers.AutoModelForSpeechSeq2Seq if speech else transformers.AutoModelForSeq2SeqLM
    return auto.from_pretrained(directory).eval()


def masks(ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The encoder's mask for token ids; none for a speech model's features."""
    return {} if ids.is_floating_point() else {"attention_mask": torch.ones_like(ids)}


def reference(model: Any, ids: torch.Tensor, new_tokens: int = 16) -> Any:
    """transformers' greedy generate, exactly ``new_tokens`` tokens (the model's own
    generation config swapped out: BART's would force its end token at the last step,
    Whisper's suppress tokens and force its language and task tokens)."""
    from transformers import GenerationConfig

    start = model.generation_config.decoder_start_token_id
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=new_tokens,
        eos_token_id=None,
        pad_token_id=0,
        decoder_start_token_id=start,
        output_logits=True,
        return_dict_in_generate=True,
    )
    saved, model.generation_config = model.generation_config, GenerationConfig()
    try:
        with torch.no_grad():
            return model.generate(ids, generation_config=config, **masks(ids))
    finally:
        model.generation_config = saved


def start_of(folder: Path) -> int:
    return int(
        json.loads((folder / "generation_config.json").read_text())["decoder_start_token_id"]
    )


def pt2_loop(folder: Path, ids: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, list[Any]]:
    """The encoder once, then the decoder (static cache of batch 2: batch 1 padded)."""
    encoder = torch.export.load(folder / "encoder.pt2").module()
    decoder = torch.export.load(folder / "decoder.pt2").module()
    rows = ids.shape[0]

    def pad(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x[-1:]]) if rows < 2 else x

    if ids.is_floating_point():  # Whisper: input_features, a decoder without a mask
        mask: dict[str, torch.Tensor] = {}
        states = encoder(input_features=pad(ids))
    else:
        mask = {"encoder_attention_mask": torch.ones_like(pad(ids))}
        states = encoder(input_ids=pad(ids), attention_mask=mask["encoder_attention_mask"])
    token = torch.full((rows, 1), start_of(folder))
    steps, tokens = [], []
    for k in range(new_tokens):
        logits = decoder(
            decoder_input_ids=pad(token),
            encoder_hidden_states=states,
            cache_position=torch.tensor([k]),
            **mask,
        )[:rows, -1]
        steps.append(logits)
        tokens.append(logits.argmax(-1))
        token = tokens[-1][:, None]
    return torch.stack(tokens, 1), steps


def onnx_loop(
    folder: Path, ids: torch.Tensor, new_tokens: int, merged: bool = False
) -> tuple[np.ndarray, list[Any]]:
    """encoder_model once, decoder_model on the start token, decoder_with_past_model after;
    ``merged``: decoder_model_merged.onnx for both, as optimum runs it (use_cache_branch false
    and every past of 0 positions, then true; the encoder presents of the first step kept)."""

    def session(name: str) -> Any:
        return ort.InferenceSession(str(folder / name), providers=["CPUExecutionProvider"])

    encoder, first, later = (
        session(n)
        for n in ("encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx")
    )
    if merged:
        first = later = session("decoder_model_merged.onnx")
    source = ids.numpy()
    if ids.is_floating_point():  # Whisper: input_features, decoders without a mask
        mask: dict[str, Any] = {}
        (states,) = encoder.run(None, {"input_features": source})
    else:
        mask = {"encoder_attention_mask": np.ones_like(source)}
        (states,) = encoder.run(
            None, {"input_ids": source, "attention_mask": mask["encoder_attention_mask"]}
        )
    token = np.full((source.shape[0], 1), start_of(folder), np.int64)
    past: dict[str, Any] = {}
    if merged:
        past = {
            i.name: np.zeros((source.shape[0], i.shape[1], 0, i.shape[3]), np.float32)
            for i in first.get_inputs()
            if i.name.startswith("past_key_values.")
        }
    steps, tokens = [], []
    for k in range(new_tokens):
        feed = {"input_ids": token, **mask}
        run = first if k == 0 else later
        if merged:
            feed.update(past, encoder_hidden_states=states, use_cache_branch=np.array([k > 0]))
        else:
            feed.update({"encoder_hidden_states": states} if k == 0 else past)
        results = dict(zip([o.name for o in run.get_outputs()], run.run(None, feed), strict=True))
        for name, value in results.items():
            if name.startswith("present.") and (k == 0 or ".encoder." not in name):
                past[name.replace("present.", "past_key_values.")] = value
        logits = results["logits"][:, -1]
        steps.append(logits)
        tokens.append(logits.argmax(-1))
        token = tokens[-1][:, None].astype(np.int64)
    return np.stack(tokens, 1), steps


def merged_loop(folder: Path, ids: torch.Tensor, new_tokens: int) -> Any:
    return onnx_loop(folder, ids, new_tokens, merged=True)


def assert_merged_decoder(folder: Path) -> None:
    """decoder_model_merged.onnx: one If on use_cache_branch over the split decoders, each
    weight stored once (smaller than the two split files together)."""
    import hashlib

    model = onnx.load(str(folder / "decoder_model_merged.onnx"))
    (node,) = model.graph.node
    assert (node.op_type, list(node.input)) == ("If", ["use_cache_branch"])
    assert model.graph.input[-1].name == "use_cache_branch"
    split = [onnx.load(str(folder / n)) for n in ("decoder_model.onnx",
                                                  "decoder_with_past_model.onnx")]  # fmt: skip
    assert [o.name for o in model.graph.output] == [o.name for o in split[0].graph.output]

    def digest(t: Any) -> str:
        return hashlib.sha256(onnx.numpy_helper.to_array(t).tobytes()).hexdigest()

    weights = [(digest(t), tuple(t.dims)) for t in model.graph.initializer]
    assert len(weights) == len(set(weights)) > 0  # no data twice
    assert {(digest(t), tuple(t.dims)) for m in split for t in m.graph.initializer} == set(weights)
    assert not [t for b in node.attribute for t in b.g.initializer if len(t.dims) > 1]
    weight_bytes = sum(len(t.raw_data) for t in model.graph.initializer)
    split_bytes = sum(len(t.raw_data) for m in split for t in m.graph.initializer)
    assert weight_bytes < 0.6 * split_bytes  # the weights both decoders hold, stored once
    sizes = [(folder / n).stat().st_size for n in ("decoder_model.onnx",
                                                   "decoder_with_past_model.onnx")]  # fmt: skip
    assert (folder / "decoder_model_merged.onnx").stat().st_size < sum(sizes)


def token_prompt(rows: int, prompt: int) -> torch.Tensor:
    return torch.randint(3, 98, (rows, prompt), generator=torch.Generator().manual_seed(7))


def assert_generates_as_transformers(
    directory: Path, folder: Path, loop: Any, make: Any = token_prompt, prompts: Any = (4, 9)
) -> None:
    """At batch 1 and 2 and each of ``prompts`` (``make(rows, prompt)``: the encoder's input)."""
    from ptconvert.generation.check import gold_logits

    model = eager(directory)
    distinct: set[int] = set()
    for rows in (1, 2):
        for prompt in prompts:
            ids = make(rows, prompt)
            want = reference(model, ids)
            got, logits = loop(folder, ids, 16)
            assert (np.asarray(got) == want.sequences[:, 1:].numpy()).all(), (rows, prompt)
            gold = None
            for k, (ours, theirs) in enumerate(zip(logits, want.logits, strict=True)):
                ours = torch.as_tensor(ours)
                if torch.allclose(ours, theirs, atol=1e-4, rtol=1e-4):
                    continue
                # T5's logits reach ~50: float32 noise there is judged against float64
                gold = gold or gold_logits(model, ids, want, **masks(ids))
                truth = gold[k].double()

                def rmse(x: torch.Tensor, truth: torch.Tensor = truth) -> float:
                    return float(((x.double() - truth) ** 2).mean().sqrt())

                assert rmse(ours) <= 3 * rmse(theirs) + 1e-5, (rows, prompt, k)
            distinct |= set(np.asarray(got).flatten().tolist())
    assert len(distinct) > 3  # the tiny model does not repeat one token: the test can fail


def test_t5_pt2_folder_unchecked_generates_with_its_own_loop(
    tiny_seq2seq: dict[str, Path], tmp_path: Path
) -> None:
    """The fast one: written without the check, generated with by the test's loop alone."""
    out = tmp_path / "t5-pt2"
    args = [str(tiny_seq2seq["t5"]), "--to", "pt2", "--task", TASK, "-o", str(out), "--no-verify"]
    assert main([*args, "--cache-length", "32", "-q"]) == 0
    ids = torch.randint(3, 98, (2, 9), generator=torch.Generator().manual_seed(7))
    want = reference(eager(tiny_seq2seq["t5"]), ids)
    got, logits = pt2_loop(out, ids, 16)
    assert torch.equal(got, want.sequences[:, 1:]) and len(set(got.flatten().tolist())) > 3
    pairs = zip(logits, want.logits, strict=True)
    worst = max(float((ours - theirs).abs().max()) for ours, theirs in pairs)
    assert worst < 1e-3  # logits of up to ~50 (T5's scaling before its tied head applied)
    assert_info_describes_the_folder(out, "seq2seq-pt2", "static, batch 2, 32 positions")


def assert_info_describes_the_folder(out: Path, layout: str, cache: str) -> None:
    """``info`` on the folder: its task, parts and cache (it is no model directory: config.json
    without weights); nothing converts from it, and the error says what it is."""
    info = ptconvert.describe(out)
    assert (info.format, info.layout) == ("hf", layout)
    assert info.metadata["task"] == TASK and info.metadata["cache"].startswith(cache)
    assert {Path(f["path"]).name for f in info.files} == {p.name for p in out.iterdir()}
    encoder, decoder = ("encoder", "decoder") if layout.endswith("pt2") else (
        "encoder_model", "decoder_model")  # fmt: skip
    suffix = ".pt2" if layout.endswith("pt2") else ".onnx"
    assert info.metadata[encoder + suffix].split(": ")[1].startswith("input_ids, attention_mask")
    assert f"{decoder}{suffix}" in info.metadata
    with pytest.raises(ptconvert.InputError, match="a generation export's folder"):
        ptconvert.detect(out)


@pytest.mark.slow
def test_t5_to_a_pt2_folder_that_generates(
    tiny_seq2seq: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t5-pt2"
    code = main([str(tiny_seq2seq["t5"]), "--to", "pt2", "--task", TASK, "-o", str(out), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "decoder.pt2", "encoder.pt2", "generation_config.json"
    ]  # fmt: skip
    assert report["generation"]["cache"] == {"kind": "static", "batch_size": 2, "length": 1024}
    check = report["generation"]["check"]
    assert check["status"] == "pass" and len(check["runs"]) == 4
    assert_generates_as_transformers(tiny_seq2seq["t5"], out, pt2_loop)
    ids = torch.randint(3, 98, (1, 5), generator=torch.Generator().manual_seed(3))
    result = ptconvert.generate(out, ids, max_new_tokens=8)  # the public runner takes the folder
    assert torch.equal(result.sequences, reference(eager(tiny_seq2seq["t5"]), ids, 8).sequences)
    # an existing output is never replaced without --force
    assert main([str(tiny_seq2seq["t5"]), "--to", "pt2", "--task", TASK, "-o", str(out)]) != 0
    assert (out / "decoder.pt2").is_file()


@pytest.mark.slow
def test_bart_to_an_onnx_folder_under_optimums_names(
    tiny_seq2seq: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "bart-onnx"
    report = ptconvert.convert(tiny_seq2seq["bart"], "onnx", out, task=TASK)
    assert report.check == "generation" and report.generation.cache["layers"] == 2
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
    assert encoder["input_ids"] == ["batch_size", "encoder_sequence_length"]
    assert encoder["last_hidden_state"] == ["batch_size", "encoder_sequence_length", 32]
    assert list(first)[:3] == ["input_ids", "encoder_attention_mask", "encoder_hidden_states"]
    assert first["present.1.encoder.value"] == ["batch_size", 4, "encoder_sequence_length", 8]
    assert first["logits"] == ["batch_size", "decoder_sequence_length", 99]
    assert later["past_key_values.0.decoder.key"] == [
        "batch_size", 4, "past_decoder_sequence_length", 8
    ]  # fmt: skip
    assert later["present.0.decoder.key"] == [
        "batch_size", 4, "past_decoder_sequence_length + decoder_sequence_length", 8
    ]  # fmt: skip
    assert "present.0.encoder.key" not in later and "encoder_hidden_states" not in later
    assert_info_describes_the_folder(out, "seq2seq-onnx", "2 layers of past_key_values")
    assert "present.N.… (8)" in ptconvert.describe(out).metadata["decoder_model.onnx"]
    assert_generates_as_transformers(tiny_seq2seq["bart"], out, onnx_loop)
    assert_generates_as_transformers(tiny_seq2seq["bart"], out, merged_loop)
    ids = torch.randint(3, 98, (2, 6), generator=torch.Generator().manual_seed(1))
    assert torch.equal(
        ptconvert.generate(out, ids, max_new_tokens=8).sequences,
        reference(eager(tiny_seq2seq["bart"]), ids, 8).sequences,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "to"), [("t5", "onnx"), ("bart", "pt2"), ("marian", "onnx"), ("marian", "pt2")]
)
def test_seq2seq_families_generate_as_transformers(
    tiny_seq2seq: dict[str, Path], tmp_path: Path, family: str, to: str
) -> None:
    out = tmp_path / f"{family}-{to}"
    report = ptconvert.convert(tiny_seq2seq[family], to, out, task=TASK)
    assert report.check == "generation"
    loop = pt2_loop if to == "pt2" else onnx_loop
    if family == "marian":  # the tiny Marian repeats one token: its logits carry the check
        model = eager(tiny_seq2seq[family])
        ids = torch.randint(3, 98, (2, 7), generator=torch.Generator().manual_seed(2))
        want = reference(model, ids)
        got, logits = loop(out, ids, 16)
        assert (np.asarray(got) == want.sequences[:, 1:].numpy()).all()
        for ours, theirs in zip(logits, want.logits, strict=True):
            torch.testing.assert_close(torch.as_tensor(ours), theirs, atol=1e-4, rtol=1e-4)
        return
    assert_generates_as_transformers(tiny_seq2seq[family], out, loop)
