"""The converter graph: formats and in-memory stages are nodes, converters are edges.

Each edge declares its cost and what it needs (a model spec, example inputs, trust, …). ``plan``
finds the cheapest route whose needs are met; when none is, it finds the cheapest route if the
needs were met and says which are missing and which option provides each. A target's converters
are declared by its package (``formats/<target>/edges``, ``Format.edges``); the stages' own are
``_core_edges``; a plugin adds its with ``register_edge``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ptconvert.errors import UnsupportedConversionError, UsageError
from ptconvert.report import Report

STAGES = ("weights", "module", "exported")
_PLUGIN_NODES: list[str] = []  # nodes a plugin's edges name that are no registered format


Step = Callable[[Any, Any], None]  # (RunState, Options) → None: fills the state it reads


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    step: str  # the step's name, in plans and reports
    cost: int
    needs: tuple[str, ...] = ()
    label: str = ""
    reads_source: bool = False  # reads the file given (only a route's first step can)
    run: Step | None = None  # the converter (a plugin's edge may be given it at registration)
    captures: bool = False  # turns a module into a program: a failed parity check rules it out


def _core_edges() -> list[Edge]:
    """The converters between the stages, which no format owns."""
    from ptconvert.convert import steps

    return [
        Edge(
            "weights",
            "module",
            "build_module",
            2,
            ("model_spec",),
            "build the model, load strictly",
            run=steps.build_module,
        ),
        # a source that is code alone: no file, the model as --model's factory builds it
        Edge(
            "code",
            "module",
            "build_from_code",
            2,
            ("model_spec",),
            "build the model from its code",
            run=steps.build_from_code,
        ),
        Edge(
            "module",
            "exported",
            "export",
            3,
            ("example_inputs",),
            "torch.export",
            run=steps.export,
            captures=True,
        ),
        Edge(
            "exported",
            "weights",
            "program_weights",
            1,
            label="the program's state dict",
            run=steps.program_weights,
        ),
    ]


# converters plugins registered (``register_edge``); the formats' own are ``format_edges()``
EDGES: list[Edge] = []


def format_edges() -> list[Edge]:
    """Each registered format's weights edges, as it declares them: reading its tensors
    (symbolically) and writing them, and a whole pickled module's load (a target package's
    converters are ``target_edges``)."""
    from ptconvert.convert import steps
    from ptconvert.convert.weights import read_source, write_target
    from ptconvert.formats import FORMATS

    out: list[Edge] = []
    for f in FORMATS:
        if f.reads_weights:
            out.append(
                Edge(
                    f.name,
                    "weights",
                    "read_weights",
                    1,
                    f.read_needs,
                    f.read_label,
                    True,
                    run=read_source,
                )
            )
        if f.may_hold_module:
            out.append(
                Edge(
                    f.name,
                    "module",
                    "unpickle_module",
                    2,
                    ("trust",),
                    "load a whole pickled module",
                    reads_source=True,
                    run=steps.unpickle_module,
                )
            )
    for f in FORMATS:
        if f.writes_weights:
            out.append(
                Edge(
                    "weights",
                    f.name,
                    "write_weights",
                    1,
                    label=f.write_label,
                    run=write_target,
                )
            )
    return out


def target_edges() -> list[Edge]:
    """The converters the registered formats' packages declare (``Format.edges``)."""
    from ptconvert.formats import FORMATS

    return [e for f in FORMATS for e in f.edges()]


def edges() -> list[Edge]:
    """Every edge of the graph: the formats' own, the stages', then the plugins' converters."""
    return [*format_edges(), *_core_edges(), *target_edges(), *EDGES]


def file_nodes() -> list[str]:
    """The targets ``--to`` accepts: every registered format, and a plugin edge's other nodes."""
    from ptconvert.formats import FORMATS

    return [*(f.name for f in FORMATS), *_PLUGIN_NODES]


def target_name(name: str) -> str:
    """``--to``'s format as registered: matched without case (``--to ONNX`` is onnx), as
    users type the names they see in the docs; an unknown name is returned as given."""
    wanted = name.strip().lower()
    return next((node for node in file_nodes() if node.lower() == wanted), name)


def _written_targets() -> list[str]:
    """The targets a route writes (not those another target's option writes: hf, sharded)."""
    from ptconvert.formats import FORMATS_BY_NAME

    return [n for n in file_nodes() if not getattr(FORMATS_BY_NAME.get(n), "written_by", None)]


def register_edge(edge: Edge, step: Step | None = None) -> None:
    """Add a converter (a plugin's): ``step(state, options)`` runs the edge (or ``edge.run``). A
    node it names that is not a stage becomes a file node (a target ``--to`` accepts)."""
    import dataclasses

    run = step or edge.run
    if run is None:
        raise UsageError(f"the converter {edge.step!r} has no step to run")
    taken = [e for e in edges() if e.step == edge.step and e.run is not run]
    if taken:
        raise UsageError(f"a converter step named {edge.step!r} is registered already")
    for node in (edge.src, edge.dst):
        if node not in STAGES and node not in file_nodes():
            _PLUGIN_NODES.append(node)
    EDGES.append(dataclasses.replace(edge, run=run))


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
    task: str | None = None  # a generation export's task (--task …-with-past)
    check: str = ""  # what the check will do, when the route says it beforehand
    notes: list[str] = field(default_factory=list)  # the snapshot a Hub id named

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
            "task": self.task,
            "check": self.check,
            "notes": self.notes,
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
        listed = ", ".join(_written_targets())
        raise UsageError(f"unknown target format {dst!r} (known: {listed})")
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
