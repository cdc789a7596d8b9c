"""What edges need, in one table: each need says how to tell it is met and how to provide it.

The engine checks an edge's needs before the route is run (``plan`` routes around unmet ones
and names them with their hint); a plugin's edge may declare a need of its own with
``Registry.add_need``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from ptconvert.errors import UsageError
from ptconvert.formats import FORMATS_BY_NAME
from ptconvert.options import Options


@dataclass(frozen=True)
class Need:
    name: str
    hint: str  # what provides it, for the message when it is missing
    met: Callable[[str, Options], bool]  # (the source's format, the options) → met?


def _model_spec(src_format: str, opts: Options) -> bool:
    known = FORMATS_BY_NAME.get(src_format)
    return bool(opts.model) or bool(known and known.carries_model_spec)


def _compiler(src_format: str, opts: Options) -> bool:
    from ptconvert.convert.aoti import compiler

    return compiler() is not None


def _installed(*modules: str) -> Callable[[str, Options], bool]:
    return lambda src_format, opts: all(importlib.util.find_spec(m) for m in modules)


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
        Need(
            "cpp_compiler",
            "install a C++ compiler (g++ or clang++) or set CXX: AOTInductor compiles the "
            "program into native code with it",
            _compiler,
        ),
        Need(
            "onnx",
            "pip install 'ptconvert[onnx]' (onnx, onnxscript and onnxruntime)",
            _installed("onnx", "onnxscript", "onnxruntime", "onnx_ir"),
        ),
        Need(
            "executorch",
            "pip install 'ptconvert[executorch]' (ExecuTorch: its lowering and its runtime)",
            _installed("executorch"),
        ),
    )
}


def register_need(need: Need) -> None:
    """Add a need (a plugin's edge may declare it)."""
    if need.name in NEEDS and NEEDS[need.name] is not need:
        raise UsageError(f"a need named {need.name!r} is registered already")
    NEEDS[need.name] = need


def available(src_format: str, opts: Options) -> frozenset[str]:
    """The needs the options, the file and this machine meet."""
    return frozenset(n.name for n in NEEDS.values() if n.met(src_format, opts))


def hint(name: str) -> str:
    need = NEEDS.get(name)
    return need.hint if need else f"{name} (a need no registered check provides)"
