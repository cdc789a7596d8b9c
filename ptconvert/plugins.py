"""Plugins: formats and converters from other packages.

A package declares an entry point in the group ``ptconvert.plugins``; it names a function that
takes a ``Registry`` and adds to it::

    # pyproject.toml of the plugin
    [project.entry-points."ptconvert.plugins"]
    toy = "ptconvert_toy:register"

    # ptconvert_toy.py
    from ptconvert.convert.graph import Edge

    def register(registry):
        # detection, info, and what the format declares: read_weights + reference (a source
        # of weights, checked bitwise), write_weights (a target): the graph's edges follow
        registry.add_format(ToyFormat())
        registry.add_edge(Edge("toy", "signed", "sign", 1, ("toy_key",)), sign)  # a converter
        registry.add_need("toy_key", "pass --metadata toy_key=…", has_key)  # what it needs

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
