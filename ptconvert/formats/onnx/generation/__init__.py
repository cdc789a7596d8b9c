"""What the ONNX target writes for a generation task, in optimum's layouts: a decoder-only LM
with ``past_key_values`` inputs and ``present`` outputs (``past.py``), a seq2seq model's folder
of encoder and decoders, the merged decoder among them (``seq2seq.py``, ``merged.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ptconvert.formats.onnx import OnnxFormat
from ptconvert.formats.onnx.generation import past, seq2seq
from ptconvert.generation.seq2seq_folder import (
    DECODER_ONNX,
    ENCODER_ONNX,
    MERGED_ONNX,
    WITH_PAST_ONNX,
)
from ptconvert.generation.targets import Target


def describe(info: Any) -> None:
    """A decoder with past inputs is a text-generation-with-past export."""
    names = [i.name for i in info.inputs or []]
    if any(n.startswith("past_key_values.") for n in names):
        info.metadata["task"] = "text-generation-with-past"


def describe_folder(info: Any) -> None:
    """The decoders' past inputs: how many layers of cache they carry."""
    import onnx

    path = Path(info.path)
    for name in (WITH_PAST_ONNX, MERGED_ONNX):
        if (path / name).is_file():
            graph = onnx.load(str(path / name), load_external_data=False).graph
            past_inputs = [i.name for i in graph.input if i.name.startswith("past_key_values.")]
            layers = len({n.split(".")[1] for n in past_inputs})
            info.metadata["cache"] = (
                f"{layers} layers of past_key_values.N.decoder|encoder.key|value in, "
                f"present.N.… out ({name})"
            )
            break


_NAME = OnnxFormat.name
TARGETS = [
    Target(
        _NAME,
        "decoder",
        past.export_with_past,
        past.read_meta,
        past.open_decoder,
        static=False,
        describe=describe,
        client="optimum's ORTModelForCausalLM",
    ),
    Target(
        _NAME,
        "seq2seq",
        seq2seq.export_folder,
        seq2seq.read_folder,
        seq2seq.open_folder,
        static=False,
        files=(ENCODER_ONNX, DECODER_ONNX, WITH_PAST_ONNX),
        extra_files=(MERGED_ONNX,),
        describe=describe_folder,
    ),
]
