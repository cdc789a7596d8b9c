"""The onnx target's converters: the graph's edges to and from it (``EDGES``). Two exporters
lead to it, one per route, as ``--onnx-exporter`` picks (``onnx_*_exporter`` needs): never
one after the other."""

from __future__ import annotations

from ptconvert.convert.graph import Edge
from ptconvert.formats.onnx import OnnxFormat
from ptconvert.formats.onnx.edges.export import onnx_export
from ptconvert.formats.onnx.edges.trace import trace_export

_NAME = OnnxFormat.name
EDGES = [
    Edge(
        "exported",
        _NAME,
        "onnx_export",
        3,
        ("onnx", "onnx_dynamo_exporter"),
        "torch.onnx (dynamo exporter)",
        run=onnx_export,
    ),
    Edge(
        "module",
        _NAME,
        "onnx_trace_export",
        3,
        ("example_inputs", "onnx", "onnx_torchscript_exporter"),
        "torch.onnx's TorchScript exporter (a trace)",
        run=trace_export,
        captures=True,
    ),
]
