"""What edges need, in one table: each need says how to tell it is met and how to provide it.

The engine checks an edge's needs before the route is run (``plan`` routes around unmet ones
and names them with their hint); a plugin's edge may declare a need of its own with
``Registry.add_need``.
"""

from __future__ import annotations

from ptconvert.errors import UsageError
from ptconvert.formats import FORMATS_BY_NAME
from ptconvert.formats.base import Need
from ptconvert.options import Options


def _model_spec(src_format: str, opts: Options) -> bool:
    known = FORMATS_BY_NAME.get(src_format)
    return bool(opts.model) or bool(known and known.carries_model_spec)


# the core needs and the plugins' (``register_need``); a format's own are ``Format.needs``
NEEDS: dict[str, Need] = {
    n.name: n
    for n in (
        Need(
            "model_spec",
            "pass --model pkg.module:factory (or file.py:factory), or give a directory with "
            "config.json",
            _model_spec,
        ),
        Need(
            "example_inputs",
            "pass --input NAME:SHAPE:DTYPE (repeatable) or --example-inputs FILE",
            # a model spec brings its own (a factory module may define example_inputs())
            lambda f, o: bool(o.inputs or o.example_inputs) or _model_spec(f, o),
        ),
        Need(
            "trust",
            "pass --trust, or --allow for each class (the file is a whole pickled module: "
            "loading it imports its classes)",
            lambda f, o: o.trusts_code,
        ),
    )
}


def register_need(need: Need) -> None:
    """Add a need (a plugin's edge may declare it)."""
    if need.name in every_need() and every_need()[need.name] is not need:
        raise UsageError(f"a need named {need.name!r} is registered already")
    NEEDS[need.name] = need


def every_need() -> dict[str, Need]:
    """The core needs, the registered formats' and the plugins'."""
    from ptconvert.formats import FORMATS

    return {**{n.name: n for f in FORMATS for n in f.needs}, **NEEDS}


def available(src_format: str, opts: Options) -> frozenset[str]:
    """The needs the options, the file and this machine meet."""
    return frozenset(n.name for n in every_need().values() if n.met(src_format, opts))


def hint(name: str) -> str:
    need = every_need().get(name)
    return need.hint if need else f"{name} (a need no registered check provides)"
