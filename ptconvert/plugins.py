"""Plugins: formats and converters from other packages.

A package declares an entry point in the group ``ptconvert.plugins``; it names a function that
takes a ``Registry`` and adds to it::

    # pyproject.toml of the plugin
    [project.entry-points."ptconvert.plugins"]
    toy = "ptconvert_toy:register"

    # ptconvert_toy.py
    from ptconvert.convert.graph import Edge

    def register(registry):
        registry.add_format(ToyFormat())                                   # formats/, info
        registry.add_edge(Edge("weights", "toy", "write_toy", 1), write_toy)  # the graph, --to
        registry.add_need("toy_license", "pass --model-arg license=yes", licensed)  # optional

Plugins are loaded once, by every API call and CLI command, before anything is read. A plugin
that fails to load fails every later call too (what it registered before failing stays).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ptconvert.deps import PLUGIN_GROUP as GROUP
from ptconvert.errors import UsageError

_loaded: list[str] = []  # the entry points loaded, by name (loading happens once)
_failed: list[UsageError] = []  # a plugin that failed keeps failing every call, as it did first


class Registry:
    """What a plugin may add: a format (detection, ``info``, ``formats``) and converters."""

    def add_format(self, fmt: Any) -> None:
        from ptconvert.formats import register_format

        register_format(fmt)

    def add_edge(self, edge: Any, step: Callable[..., None]) -> None:
        from ptconvert.convert.graph import register_edge

        register_edge(edge, step)

    def add_weights_reader(
        self, format_name: str, reader: Callable[..., Any], independent: Callable[..., Any]
    ) -> None:
        """Weights out of a plugin's format: ``reader(detection, key, skip_unsupported)`` gives
        a ``weights.read.WeightSet``; ``independent(weight_set, may_load_program, exit_stack)``
        reads the same file another way for the bitwise check (``verify.independent``)."""
        from ptconvert.convert.graph import Edge, register_edge
        from ptconvert.convert.steps import read_weights_step
        from ptconvert.verify.independent import INDEPENDENT_READERS
        from ptconvert.weights.read import READERS

        if format_name in READERS:
            raise UsageError(f"a weights reader for {format_name!r} is registered already")
        READERS[format_name] = reader
        INDEPENDENT_READERS[format_name] = independent
        # its weights reach the graph too (with a model spec: a module, a program)
        register_edge(
            Edge(format_name, "weights", "read_weights", 1, label="read its weights"),
            read_weights_step,
        )

    def add_need(self, name: str, hint: str, met: Callable[[str, Any], bool]) -> None:
        """A need the plugin's edges declare: ``met(source format, options)`` says whether it
        is there; ``hint`` says how to provide it."""
        from ptconvert.convert.needs import Need, register_need

        register_need(Need(name, hint, met))


def load_plugins() -> list[str]:
    """Load every ``ptconvert.plugins`` entry point (once); return their names."""
    if _failed:
        raise _failed[0]
    if _loaded:
        return [n for n in _loaded if n]
    from importlib.metadata import entry_points

    _loaded.append("")  # loading starts: a plugin that calls the API does not load again
    for ep in entry_points(group=GROUP):
        try:
            ep.load()(Registry())
        except Exception as exc:  # a plugin's own failure: say whose
            _failed.append(
                UsageError(
                    f"the ptconvert plugin {ep.name!r} ({ep.value}) failed to load: "
                    f"{type(exc).__name__}: {exc}",
                    hint=f"uninstall it, or fix it: it is registered under {GROUP!r}",
                )
            )
            raise _failed[0] from None
        _loaded.append(ep.name)
    return [n for n in _loaded if n]
