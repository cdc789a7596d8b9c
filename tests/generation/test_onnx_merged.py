"""The merged seq2seq decoder (``decoder_model_merged.onnx``, formats/onnx/generation/merged.py)
built from two tiny hand-made decoders in optimum's layout: one ``If`` on ``use_cache_branch``,
the weights of both stored once (a name meaning different data in each kept apart), and each
branch computing what its split decoder computes in onnxruntime. The T5, BART and Whisper
folders' merged decoders are tests/generation/test_seq2seq.py's and test_whisper.py's (slow)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ptconvert.errors import VerificationError
from ptconvert.formats.onnx.generation.merged import compare_branch, merge_decoders

F, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(0)
EMBED, HEAD, BIAS = (RNG.standard_normal(s).astype(np.float32) for s in ((5, 4), (4, 5), (5,)))


def value(name: str, elem: int, dims: list[Any]) -> Any:
    return helper.make_tensor_value_info(name, elem, dims)


def init(name: str, array: np.ndarray) -> Any:
    return numpy_helper.from_array(array, name)


def decoder(with_past: bool) -> Any:
    """logits = embed(input_ids) @ head + bias; the decoder's present: the embeddings (after
    the past's), the encoder's: its states' projection. ``bias`` is the same weight in both
    under the name ``w``; ``c`` means different data in each (1-D int ``axes`` stays)."""
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["emb"]),
        helper.make_node("MatMul", ["emb", "head"], ["mm"]),
        helper.make_node("Add", ["mm", "w"], ["biased"]),
        helper.make_node("Mul", ["biased", "c"], ["logits"]),
        helper.make_node("Unsqueeze", ["emb", "axes"], ["own"]),
    ]
    past = [1, "past_decoder_sequence_length + decoder_sequence_length", 4]
    outputs = [value("logits", F, ["batch_size", "decoder_sequence_length", 5])]
    if with_past:
        inputs = [
            value("input_ids", I64, ["batch_size", "decoder_sequence_length"]),
            value("past_key_values.0.decoder.key", F, ["batch_size", 1, "past", 4]),
            value("past_key_values.0.encoder.key", F, ["batch_size", 1, 3, 4]),  # fixed: Whisper
        ]
        nodes.append(
            helper.make_node(
                "Concat", ["past_key_values.0.decoder.key", "own"], ["present.0.decoder.key"],
                axis=2,
            )
        )  # fmt: skip
        outputs.append(value("present.0.decoder.key", F, ["batch_size", *past]))
    else:
        inputs = [
            value("input_ids", I64, ["batch_size", "decoder_sequence_length"]),
            value("encoder_hidden_states", F, ["batch_size", 3, 4]),
        ]
        nodes += [
            helper.make_node("Identity", ["own"], ["present.0.decoder.key"]),
            helper.make_node("MatMul", ["encoder_hidden_states", "proj"], ["cross"]),
            helper.make_node("Unsqueeze", ["cross", "axes"], ["present.0.encoder.key"]),
        ]
        outputs += [
            value("present.0.decoder.key", F, ["batch_size", 1, "decoder_sequence_length", 4]),
            value("present.0.encoder.key", F, ["batch_size", 1, 3, 4]),
        ]
    inits = [
        init("embed", EMBED),
        init("head", HEAD),
        init("w", BIAS),
        init("c", np.full(5, 2.0 if with_past else 1.0, np.float32)),
        init("axes", np.array([1], np.int64)),
    ]
    if not with_past:
        inits.append(init("proj", RNG.standard_normal((4, 4)).astype(np.float32)))
    graph = helper.make_graph(nodes, "decoder", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    onnx.save(decoder(False), tmp_path / "decoder_model.onnx")
    onnx.save(decoder(True), tmp_path / "decoder_with_past_model.onnx")
    return tmp_path


def run(path: Path, feed: dict[str, Any]) -> dict[str, Any]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed), strict=True))


def test_the_merged_decoder_is_one_if_over_both_with_weights_stored_once(folder: Path) -> None:
    merged = folder / "decoder_model_merged.onnx"
    counts = merge_decoders(
        folder / "decoder_model.onnx", folder / "decoder_with_past_model.onnx", merged
    )
    model = onnx.load(str(merged))
    (node,) = model.graph.node
    assert (node.op_type, list(node.input)) == ("If", ["use_cache_branch"])
    assert [i.name for i in model.graph.input] == [
        "input_ids", "encoder_hidden_states", "past_key_values.0.decoder.key",
        "past_key_values.0.encoder.key", "use_cache_branch",
    ]  # fmt: skip
    use_cache = model.graph.input[-1].type.tensor_type
    assert use_cache.elem_type == TensorProto.BOOL and use_cache.shape.dim[0].dim_value == 1
    outputs = ["logits", "present.0.decoder.key", "present.0.encoder.key"]
    assert [o.name for o in model.graph.output] == outputs
    # embed, head and w once each; c twice (two data under one name); axes in each branch
    outer = sorted(i.name for i in model.graph.initializer)
    assert outer == ["c", "c_merged_0", "embed", "head", "proj", "w"]
    assert counts == {"weights": 6, "shared": 3, "bytes": 4 * (20 + 20 + 5 + 5 + 5 + 16),
                      "shared_bytes": 4 * (20 + 20 + 5)}  # fmt: skip
    for branch in node.attribute:
        assert [i.name for i in branch.g.initializer] == ["axes"]
    ids = np.array([[1, 4], [2, 3]], np.int64)
    states = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    first = run(folder / "decoder_model.onnx", {"input_ids": ids, "encoder_hidden_states": states})
    empty = np.zeros((2, 1, 0, 4), np.float32)
    feed = {"input_ids": ids, "encoder_hidden_states": states, "use_cache_branch": [False]}
    # optimum's first step: every past of 0 positions (the encoder's too, fixed 3 when split)
    got = run(merged, {**feed, "past_key_values.0.decoder.key": empty,
                       "past_key_values.0.encoder.key": empty})  # fmt: skip
    assert all(np.array_equal(got[n], first[n]) for n in outputs)
    assert compare_branch(got, first, False, merged) == 0.0
    past = {
        "past_key_values.0.decoder.key": first["present.0.decoder.key"],
        "past_key_values.0.encoder.key": first["present.0.encoder.key"],
    }
    later = run(folder / "decoder_with_past_model.onnx", {"input_ids": ids[:, :1], **past})
    feed = {**feed, **past, "input_ids": ids[:, :1], "use_cache_branch": np.array([True])}
    got = run(merged, feed)
    assert set(later) == {"logits", "present.0.decoder.key"}
    assert all(np.array_equal(got[n], later[n]) for n in later)
    assert got["present.0.decoder.key"].shape == (2, 1, 3, 4)
    # the encoder's keys do not change: the with-past branch gives an empty constant
    assert got["present.0.encoder.key"].shape == (0, 1, 3, 4)
    got["logits"] = got["logits"] + 1e-2
    with pytest.raises(VerificationError, match=r"use_cache_branch true.*logits by up to 0\.01"):
        compare_branch(got, later, True, merged)
