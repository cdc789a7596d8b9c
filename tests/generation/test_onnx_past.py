"""Decoder-only LMs to ONNX with past inputs and present outputs under optimum's names, run by
a loop of the test's own on onnxruntime (present fed back as past, an empty past first)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import ptconvert
from tests.generation.conftest import eager, reference

TASK = "text-generation-with-past"


def ort_loop(path: Path, ids: torch.Tensor, new_tokens: int) -> tuple[np.ndarray, list[np.ndarray]]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    past_names = [n for n in inputs if n.startswith("past_key_values.")]
    rows = ids.shape[0]
    past = {
        n: np.zeros((rows, inputs[n].shape[1], 0, inputs[n].shape[3]), np.float32)
        for n in past_names
    }
    feed_ids, seen, tokens, steps = ids.numpy(), 0, [], []
    for _ in range(new_tokens):
        count = feed_ids.shape[1]
        feed = {"input_ids": feed_ids, "attention_mask": np.ones((rows, seen + count), np.int64)}
        if "position_ids" in inputs:
            feed["position_ids"] = np.tile(np.arange(seen, seen + count), (rows, 1))
        results = dict(
            zip(
                [o.name for o in session.get_outputs()],
                session.run(None, {**feed, **past}),
                strict=True,
            )
        )
        past = {n: results[n.replace("past_key_values", "present")] for n in past_names}
        seen += count
        logits = results["logits"][:, -1]
        steps.append(logits)
        tokens.append(logits.argmax(-1))
        feed_ids = tokens[-1][:, None].astype(np.int64)
    return np.stack(tokens, 1), steps


def assert_generates_as_transformers(directory: Path, artifact: Path) -> None:
    model = eager(directory)
    distinct: set[int] = set()
    for rows in (1, 2):
        for prompt in (4, 9):
            ids = torch.randint(3, 99, (rows, prompt), generator=torch.Generator().manual_seed(5))
            want = reference(model, ids)
            got, logits = ort_loop(artifact, ids, 16)
            assert (got == want.sequences[:, prompt:].numpy()).all(), (rows, prompt)
            for ours, theirs in zip(logits, want.logits, strict=True):
                np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-4, rtol=1e-4)
            distinct |= set(got.flatten().tolist())
    assert len(distinct) > 3


def test_gpt2_with_past_under_optimums_names(tiny: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "gpt2.onnx"
    report = ptconvert.convert(tiny["gpt2"], "onnx", out, task=TASK)
    assert report.check == "generation" and report.generation.cache["layers"] == 2
    graph = onnx.load(str(out)).graph
    dims = {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*graph.input, *graph.output]
    }
    assert dims["input_ids"] == ["batch_size", "sequence_length"]
    assert dims["position_ids"] == ["batch_size", "sequence_length"]
    assert dims["attention_mask"] == ["batch_size", "past_sequence_length + sequence_length"]
    assert dims["past_key_values.1.value"] == ["batch_size", 4, "past_sequence_length", 8]
    assert dims["present.0.key"] == ["batch_size", 4, "past_sequence_length + sequence_length", 8]
    assert dims["logits"] == ["batch_size", "sequence_length", 99]
    assert [o.name for o in graph.output] == [
        "logits", "present.0.key", "present.0.value", "present.1.key", "present.1.value"
    ]  # fmt: skip
    # the tied embedding and lm_head: one 99 × 32 initializer
    assert sum(1 for i in graph.initializer if list(i.dims) in ([99, 32], [32, 99])) == 1
    # torch.onnx's debug metadata (stack traces naming this machine's files) stripped, as on
    # the graph route: it was most of the file
    assert not [p.key for n in graph.node for p in n.metadata_props]
    assert_generates_as_transformers(tiny["gpt2"], out)
    assert ptconvert.describe(out).metadata["task"] == TASK
    ids = torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(1))
    assert torch.equal(
        ptconvert.generate(out, ids, max_new_tokens=8).sequences,
        reference(eager(tiny["gpt2"]), ids, 8).sequences,
    )


def test_without_an_onnx_name_the_decoder_is_written_as_optimums_folder(
    tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 40: -o OUT wrote one bare file at OUT (optimum's ORTModelForCausalLM took it for a
    hub id) and -o DIR/ was ignored. Now the decoder goes in a folder as optimum loads it:
    model.onnx beside the source's config.json, generation_config.json and other files but
    its weights; -o NAME.onnx still writes one file and says what a client misses."""
    from tests.conftest import run_cli

    source = tiny["gpt2"]
    kept = sorted(p.name for p in source.iterdir() if p.suffix != ".safetensors")
    assert {"config.json", "generation_config.json"} <= set(kept)
    for out in (tmp_path / "gpt2-onnx", f"{tmp_path / 'dir'}/"):
        code, report, _ = run_cli(
            [str(source), "--to", "onnx", "--task", TASK, "-o", str(out)], capsys
        )
        assert code == 0 and report["check"] == "generation", report
        folder = Path(out)
        assert report["output"] == str(folder) and folder.is_dir(), report["output"]
        assert sorted(p.name for p in folder.iterdir()) == sorted(["model.onnx", *kept])
        assert any("model.onnx beside config.json" in n for n in report["notes"])
    assert_generates_as_transformers(source, folder / "model.onnx")
    ids = torch.randint(3, 99, (1, 5), generator=torch.Generator().manual_seed(2))
    assert torch.equal(
        ptconvert.generate(folder, ids, max_new_tokens=6).sequences,
        reference(eager(source), ids, 6).sequences,
    )
    info = ptconvert.describe(folder)
    assert info.format == "onnx" and info.layout == "folder" and info.metadata["task"] == TASK
    one = tmp_path / "one.onnx"
    report = ptconvert.convert(source, "onnx", one, task=TASK)
    assert one.is_file() and any("-o DIR/ writes it" in n for n in report.notes), report.notes


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_llama_and_qwen2_with_past(tiny: dict[str, Path], tmp_path: Path, family: str) -> None:
    out = tmp_path / f"{family}.onnx"
    ptconvert.convert(tiny[family], "onnx", out, task=TASK)
    inputs = [i.name for i in onnx.load(str(out)).graph.input]
    assert inputs[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert_generates_as_transformers(tiny[family], out)
