"""The converter graph: formats and in-memory stages are nodes, converters are edges.

Each edge declares its cost and what it needs (a model spec, example inputs, trust, …). ``plan``
finds the cheapest route whose needs are met; when none is, it finds the cheapest route if the
needs were met and says which are missing and which option provides each. Adding a converter is
one ``Edge`` line in ``EDGES`` and one function in ``steps.py``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

from ptconvert.errors import UnsupportedConversionError, UsageError
from ptconvert.report import Report

STAGES = ("weights", "module", "exported")
_PLUGIN_NODES: list[str] = []  # nodes a plugin's edges name that are no registered format


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    step: str  # function name in ptconvert.convert.steps
    cost: int
    needs: tuple[str, ...] = ()
    label: str = ""
    reads_source: bool = False  # reads the file given (only a route's first step can)


# the converters (plugins append theirs); the formats' own edges are ``format_edges()``
EDGES: list[Edge] = [
    Edge("weights", "module", "build_module", 2, ("model_spec",), "build the model, load strictly"),
    # a source that is code alone: no file, the model as --model's factory builds it
    Edge("code", "module", "build_from_code", 2, ("model_spec",), "build the model from its code"),
    Edge(
        "pt",
        "module",
        "unpickle_module",
        2,
        ("trust",),
        "load a whole pickled module",
        reads_source=True,
    ),
    Edge("module", "exported", "export", 3, ("example_inputs",), "torch.export"),
    Edge("module", "torchscript", "script", 4, (), "torch.jit.script (or trace)"),
    Edge("torchscript", "exported", "ts_to_exported", 4, ("example_inputs",), "TS2EPConverter"),
    Edge(
        "pt2",
        "exported",
        "load_pt2",
        1,
        label="torch.export.load (after the scan)",
        reads_source=True,
    ),
    Edge("exported", "pt2", "save_pt2", 1, label="torch.export.save"),
    Edge("exported", "weights", "program_weights", 1, label="the program's state dict"),
    Edge("exported", "aoti", "aoti_compile", 6, ("cpp_compiler",), "AOTInductor compile + package"),
    Edge("exported", "onnx", "onnx_export", 3, ("onnx",), "torch.onnx (dynamo exporter)"),
    Edge(
        "exported",
        "pte",
        "pte_export",
        4,
        ("executorch",),
        "ExecuTorch lowering (XNNPACK or portable kernels)",
    ),
]


def format_edges() -> list[Edge]:
    """Each registered format's edges to and from the weights stage, as it declares them: read
    (the file's tensors, read symbolically; a program's also its loaded state dict, for any
    program the route holds: ``read_step``) and write."""
    from ptconvert.formats import FORMATS

    out: list[Edge] = []
    for f in FORMATS:
        if f.reads_weights:
            out.append(Edge(f.name, "weights", "read_weights", 1, f.read_needs, f.read_label, True))
        if f.reads_weights and f.read_step != "read_weights":
            label = "the loaded program's state dict"
            out.append(Edge(f.name, "weights", f.read_step, 1, f.read_needs, label))
    for f in FORMATS:
        if f.writes_weights:
            out.append(Edge("weights", f.name, "write_weights", 1, label=f.write_label))
    return out


def edges() -> list[Edge]:
    """Every edge of the graph: the formats' own, then the converters."""
    return [*format_edges(), *EDGES]


def file_nodes() -> list[str]:
    """The targets ``--to`` accepts: every registered format, and a plugin edge's other nodes."""
    from ptconvert.formats import FORMATS

    return [*(f.name for f in FORMATS), *_PLUGIN_NODES]


def register_edge(edge: Edge, step: Any) -> None:
    """Add a converter (a plugin's): ``step(state, options)`` runs the edge. A node it names that
    is not a stage becomes a file node (a target ``--to`` accepts)."""
    from ptconvert.convert.steps import STEPS

    if edge.step in STEPS and STEPS[edge.step] is not step:
        raise UsageError(f"a converter step named {edge.step!r} is registered already")
    STEPS[edge.step] = step
    for node in (edge.src, edge.dst):
        if node not in STAGES and node not in file_nodes():
            _PLUGIN_NODES.append(node)
    EDGES.append(edge)


@dataclass
class Plan(Report):
    src: str
    dst: str
    edges: list[Edge]
    missing: dict[str, str] = field(default_factory=dict)  # need → how to provide it
    source: str = ""  # the file planned for
    # program routes: the peak memory estimated from the weights' size, and what is free
    memory_estimate_bytes: int | None = None
    memory_available_bytes: int | None = None
    weight_bytes: int | None = None  # what a program written by the route holds, about
    # program routes: which dims of which inputs will be dynamic, over which range, in words
    dynamic: dict[str, str] = field(default_factory=dict)

    @property
    def runnable(self) -> bool:
        return not self.missing

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "from": self.src,
            "to": self.dst,
            "runnable": self.runnable,
            "steps": [
                {
                    "from": e.src,
                    "to": e.dst,
                    "step": e.step,
                    "needs": list(e.needs),
                    "what": e.label,
                }
                for e in self.edges
            ],
            "missing": self.missing,
            "memory_estimate_bytes": self.memory_estimate_bytes,
            "memory_available_bytes": self.memory_available_bytes,
            "dynamic": self.dynamic,
        }

    def describe(self) -> list[str]:
        return [f"{e.src} → {e.dst}: {e.label or e.step}" for e in self.edges]


def _search(
    src: str, dst: str, have: frozenset[str], banned: frozenset[Edge], relax: bool
) -> list[Edge] | None:
    queue: list[tuple[int, int, str, list[Edge]]] = [(0, 0, src, [])]
    best: dict[str, int] = {}
    counter = 0
    graph = edges()
    while queue:
        cost, _, node, path = heapq.heappop(queue)
        if node == dst and path:
            return path
        if best.get(node, 1 << 30) <= cost:
            continue
        best[node] = cost
        for e in graph:
            if e.src != node or e in banned or e in path:
                continue
            if e.reads_source and path:
                continue  # it reads the source file: a file the route wrote is never reread
            lacking = [n for n in e.needs if n not in have]
            if lacking and not relax:
                continue
            counter += 1
            penalty = 100 * len(lacking)
            heapq.heappush(queue, (cost + e.cost + penalty, counter, e.dst, [*path, e]))
    return None


def plan(
    src: str, dst: str, have: frozenset[str] = frozenset(), banned: frozenset[Edge] = frozenset()
) -> Plan:
    """The cheapest route from ``src`` to ``dst`` given the needs that are met."""
    nodes = file_nodes()
    if dst not in nodes:
        raise UsageError(f"unknown target format {dst!r} (known: {', '.join(nodes)})")
    path = _search(src, dst, have, banned, relax=False)
    if path is not None:
        return Plan(src, dst, path)
    path = _search(src, dst, have, banned, relax=True)
    if path is None:
        from ptconvert.formats import FORMATS_BY_NAME

        known = FORMATS_BY_NAME.get(dst)
        if known is not None and known.written_by:
            raise UsageError(
                f"{dst} is written by another target's option", hint=f"use {known.written_by}"
            )
        raise UnsupportedConversionError(f"no converter route leads from {src} to {dst}")
    from ptconvert.convert.needs import hint

    missing = {n: hint(n) for e in path for n in e.needs if n not in have}
    return Plan(src, dst, path, missing)


def graph_text(kind: str) -> str:
    """The graph as Mermaid or DOT text."""
    if kind == "mermaid":
        lines = ["graph LR"]
        for e in edges():
            needs = f"|needs {', '.join(e.needs)}|" if e.needs else ""
            lines.append(f"  {e.src} -->{needs} {e.dst}")
        return "\n".join(lines)
    lines = ["digraph ptconvert {", "  rankdir=LR;"]
    lines += [f"  {s} [shape=ellipse, style=dashed];" for s in STAGES]
    for e in edges():
        label = e.step + (f"\\nneeds {', '.join(e.needs)}" if e.needs else "")
        lines.append(f'  {e.src} -> {e.dst} [label="{label}"];')
    lines.append("}")
    return "\n".join(lines)
