"""A transformers config's rope scaling, in either spelling (transformers 5's
``rope_parameters``, 4's ``rope_scaling``), read from its config.json dict."""

from __future__ import annotations

from typing import Any

# rope types whose frequencies change with the sequence's length at run time (a branch on the
# length: a trace freezes it at the example's)
LENGTH_DEPENDENT = ("dynamic", "longrope")


def rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """The config's rope parameters, either transformers' spelling."""
    found = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return found if isinstance(found, dict) else {}


def rope_type(config: dict[str, Any]) -> str:
    """The config's rope scaling type ("default": none), either transformers' spelling."""
    found = rope_parameters(config)
    return str(found.get("rope_type", found.get("type", "default")) or "default")


def rope_types(config: dict[str, Any]) -> set[str]:
    """Every rope type the config uses: its own, and each layer type's where the parameters
    are given per layer type (Gemma 3)."""
    found = rope_parameters(config)
    nested = [v for v in found.values() if isinstance(v, dict)]
    return {rope_type(config), *(rope_type({"rope_parameters": v}) for v in nested)}
