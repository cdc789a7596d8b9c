"""The aoti target's converters: the graph's edges to and from it (``EDGES``)."""

from __future__ import annotations

from ptconvert.convert.graph import Edge
from ptconvert.formats.aoti import AotiPackageFormat
from ptconvert.formats.aoti.edges.compile import aoti_compile

_NAME = AotiPackageFormat.name
EDGES = [
    Edge(
        "exported",
        _NAME,
        "aoti_compile",
        6,
        ("cpp_compiler",),
        "AOTInductor compile + package",
        run=aoti_compile,
    ),
]
