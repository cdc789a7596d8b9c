"""The pte target's converters: the graph's edges to and from it (``EDGES``)."""

from __future__ import annotations

from ptconvert.convert.graph import Edge
from ptconvert.formats.pte import PteFormat
from ptconvert.formats.pte.edges.export import pte_export

_NAME = PteFormat.name
EDGES = [
    Edge(
        "exported",
        _NAME,
        "pte_export",
        4,
        ("executorch",),
        "ExecuTorch lowering (XNNPACK or portable kernels)",
        run=pte_export,
    ),
]
