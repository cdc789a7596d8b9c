"""The gguf target's converter: a Hugging Face causal-LM directory written as llama.cpp's GGUF
(``EDGES``). It reads the directory itself (config.json and tokenizer.json beside the weights),
not the weights stage, which has neither."""

from __future__ import annotations

from ptconvert.convert.graph import Edge
from ptconvert.formats.gguf import GgufFormat
from ptconvert.formats.gguf.edges.write import write_gguf
from ptconvert.formats.hf import HuggingFaceFormat

EDGES = [
    Edge(
        HuggingFaceFormat.name,
        GgufFormat.name,
        "gguf_write",
        2,
        label="llama.cpp's GGUF (gguf.GGUFWriter): metadata, vocabulary, tensors",
        reads_source=True,
        run=write_gguf,
    ),
]
