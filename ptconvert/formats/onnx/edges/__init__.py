"""The onnx target's converters: the graph's edges to and from it (``EDGES``)."""

from __future__ import annotations

from ptconvert.convert.graph import Edge
from ptconvert.formats.onnx import OnnxFormat
from ptconvert.formats.onnx.edges.export import onnx_export

_NAME = OnnxFormat.name
EDGES = [
    Edge(
        "exported",
        _NAME,
        "onnx_export",
        3,
        ("onnx",),
        "torch.onnx (dynamo exporter)",
        run=onnx_export,
    ),
]
