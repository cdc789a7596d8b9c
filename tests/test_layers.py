"""The import graph: every import between ptconvert's parts (module level or inside a function,
both are dependencies) goes down the layers of docs/architecture.md, and no module imports
itself back through others. The known exceptions are listed here one by one, each with its
reason: the lists may shrink, never grow."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "ptconvert"

# lower layers first: a part may import its own layer and the layers before it
LAYERS: list[set[str]] = [
    # core
    {
        "errors",
        "report",
        "deps",
        "quiet",
        "progress",
        "atomic",
        "archive",
        "options",
        "memory",
        "spawn",
        "hub",  # Hugging Face Hub ids resolved in the Hub cache (huggingface_hub imported lazily)
        "_compat",  # the declared hooks on torch's and transformers' private APIs
    },
    {"pickles"},  # pickles read without running them: the symbolic machine, the allowlist
    {"formats"},  # reading files without running them: detection, info, each format's reader
    {"scan"},  # the security scanner: what a file holds and whether loading it runs code
    {"weights"},  # weight sets: any source read into entries, and the writers
    {"model"},  # models in memory: example inputs, model specs, wrappers, eager modules
    {"verify"},  # checks: parity, ranges, bitwise weights; runtimes per format
    {"convert"},  # the converter graph and its engine
    # a program target's converters: the ``edges`` subpackage of its package under formats/
    # (the rest of the package, detection and its runtime, sits with the readers)
    {"targets"},
    {"generation"},  # exports with a KV cache, checked by generating (uses convert's ONNX step)
    # a target's generation exports: the ``generation`` module (or subpackage) of its package
    # under formats/, read by generation/targets.py through ``Format.generation_targets``
    {"target_generation"},
    {"api", "plugins"},  # the public API, and the formats and converters plugins add
    # the terminal: the command, its subcommands, its flags (made from the options' fields)
    {
        "render",
        "render_table",
        "render_progress",
        "cli",
        "cli_commands",
        "cli_flags",
        "__main__",
        "__init__",
    },
]

# parts that import each other (a cycle), each with why it is still there
KNOWN: dict[tuple[str, str], str] = {}

# modules that import one another round (a strongly connected component of the module import
# graph), each with why it is still there
KNOWN_MODULE_CYCLES: list[tuple[set[str], str]] = []


def _part(module: str) -> str:
    """``ptconvert.convert.engine`` → ``convert``; the package itself → ``__init__``; a target
    package's converters (``ptconvert.formats.onnx.edges…``) → ``targets``, its generation
    exports (``ptconvert.formats.onnx.generation…``) → ``target_generation``."""
    parts = module.split(".")
    if len(parts) > 3 and parts[1] == "formats" and parts[3] == "edges":
        return "targets"
    if len(parts) > 3 and parts[1] == "formats" and parts[3] == "generation":
        return "target_generation"
    return parts[1] if len(parts) > 1 else "__init__"


def _is_module(name: str) -> bool:
    """``ptconvert.convert.engine`` names a module or a package of ptconvert."""
    path = PACKAGE.joinpath(*name.split(".")[1:])
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _module_imports() -> dict[tuple[str, str], list[str]]:
    """Module → module it imports (``from ptconvert.a import b``: the module ``ptconvert.a.b``
    where there is one, else ``ptconvert.a``), with where each import is."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("ptconvert")
            ):
                targets = [
                    f"{node.module}.{a.name}"
                    if _is_module(f"{node.module}.{a.name}")
                    else node.module
                    for a in node.names
                ]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("ptconvert")]
            for target in targets:
                if target != module:
                    found.setdefault((module, target), []).append(f"{rel}:{node.lineno}")
    return found


def _imports() -> dict[tuple[str, str], list[str]]:
    """Part → part it imports (its modules' imports), with where each import is."""
    found: dict[tuple[str, str], list[str]] = {}
    for (source, target), where in _module_imports().items():
        if _part(source) != _part(target):
            found.setdefault((_part(source), _part(target)), []).extend(where)
    return found


def _cycles(edges: Iterable[tuple[str, str]]) -> list[set[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _layer(part: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if part in layer)


def test_every_part_has_a_layer() -> None:
    parts = {_part(f"ptconvert.{p.stem}") for p in PACKAGE.iterdir() if p.suffix == ".py"}
    parts |= {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert parts <= set().union(*LAYERS), parts - set().union(*LAYERS)


def test_imports_go_down_the_layers() -> None:
    upward = {
        pair: where for pair, where in _imports().items() if _layer(pair[1]) > _layer(pair[0])
    }
    assert not upward, upward


def test_no_two_parts_import_each_other_but_the_known() -> None:
    found = _imports()
    cycles = {(a, b) for a, b in found if (b, a) in found and a < b}
    assert cycles <= set(KNOWN), {c: found[c] + found[c[::-1]] for c in cycles - set(KNOWN)}


def test_the_known_exceptions_still_exist() -> None:
    """An exception that was removed comes off the list."""
    found = _imports()
    assert all(pair in found for pair in KNOWN), [p for p in KNOWN if p not in found]


def test_no_module_imports_itself_back_but_the_known() -> None:
    """Each cycle of the module import graph not listed, named with the imports that make it."""
    found = _module_imports()
    known = [modules for modules, _ in KNOWN_MODULE_CYCLES]
    unknown = {}
    for cycle in _cycles(found):
        if cycle not in known:
            unknown[" ⇄ ".join(sorted(cycle))] = sorted(
                f"{where} → {b}"
                for (a, b), places in found.items()
                if a in cycle and b in cycle
                for where in places
            )
    assert not unknown, unknown


def test_the_known_module_cycles_still_exist() -> None:
    """A cycle that was removed (or changed) comes off the list."""
    cycles = _cycles(_module_imports())
    assert all(modules in cycles for modules, _ in KNOWN_MODULE_CYCLES), [
        sorted(modules) for modules, _ in KNOWN_MODULE_CYCLES if modules not in cycles
    ]


def test_only_the_terminal_imports_rich() -> None:
    """Progress reaches the terminal through a reporter the CLI installs (progress.py)."""
    importers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            if any(n == "rich" or n.startswith("rich.") for n in names):
                importers.add(path.relative_to(PACKAGE).as_posix())
    assert importers == {"render.py", "render_table.py", "render_progress.py"}
