"""AOTI with a static cache (``--to aoti --task text-generation-with-past``): the decoder-only
LM's static-cache program (``static_cache.py``'s wrapper) compiled by AOTInductor through
the aoti target's compile (its input checks, Inductor configs, the refusal of baked
scalars), the archive's ``generation.json`` added to the package.

The package keeps its cache across calls only when the cache tensors are the program's
*buffers*. For a pt2, ``static_cache.export_decoder`` exports transformers' wrapper as it
is: its ``StaticCache`` layers hold the tensors the wrapper registers as buffers, but the layers
are plain attributes, so non-strict export sees them as lifted constants (``CONSTANT_TENSOR``
inputs) that the graph mutates in place. A ``.pt2``'s module runs that graph eagerly and the
constants keep the mutation; Inductor refuses it ("mutating a non-functional tensor with a
functional tensor is not allowed" at the wrapper's ``cumulative_length.copy_``). Exported with
``own_buffers=True`` the layers are pointed at the module's own buffers inside ``forward``, so
the cache is ``BUFFER`` inputs mutated in place: the compiled package writes them in its
constant storage and the next call reads them (tested step by step against the ``.pt2``'s
module and transformers' ``generate``). Each loaded runner has its own cache; a call at
``cache_position`` 0 starts a new sequence (the wrapper resets the lengths from
``cache_position[0]`` and the mask hides the stale positions)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

from ptconvert.errors import UnsupportedConversionError, UsageError
from ptconvert.formats.aoti import AotiPackageFormat
from ptconvert.generation.static_cache import (
    META_NAME,
    StaticCacheProgram,
    describe_static,
    read_static,
)
from ptconvert.generation.targets import Target


def check_buffers(ep: Any) -> None:
    """Refuse a program whose graph mutates a constant (the cache not in buffers): Inductor
    cannot compile it, and saying so beats its functionalization assert."""
    constants = {
        s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "CONSTANT_TENSOR"
    }
    for node in ep.graph.nodes:
        target = str(getattr(node, "target", ""))
        mutated = target.endswith("_.default") and node.args and str(node.args[0])
        if node.op == "call_function" and mutated in constants:
            raise UnsupportedConversionError(
                f"the static cache is not in the program's buffers ({mutated} is mutated by "
                f"{target}): AOTInductor cannot compile a mutated constant",
                hint="convert to pt2 (its module keeps the constants' mutations)",
            )


def compile_package(ep: Any, src: Path, tmp: Path, destination: Path, opts: Any) -> list[str]:
    """``ep`` compiled by the aoti target's ``compile.py`` (one compile path: input checks on
    every call, ``--aoti-option``, baked scalars refused) onto ``tmp``; its notes."""
    from ptconvert.convert.state import RunState
    from ptconvert.formats import detect
    from ptconvert.formats.aoti.edges.compile import aoti_compile

    if opts.device != "cpu":
        raise UsageError(
            "--to aoti --task text-generation-with-past compiles for the CPU only so far "
            "(the generation check and ptconvert.generate run there)",
            hint="drop --device, or convert to pt2",
        )
    check_buffers(ep)
    state = RunState(src, detect(src).format, output=tmp, destination=destination, exported=ep)
    aoti_compile(state, opts)
    return state.notes


def export_package(
    model: Any, src: Path, tmp: Path, out: Path, opts: Any, notes: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The decoder-only LM into an AOTI package at ``tmp`` (``out`` once checked): exported
    with its static cache in buffers, compiled, ``generation.json`` added; the report's cache
    and interface."""
    from ptconvert import progress
    from ptconvert.generation.static_cache import export_static, static_meta

    ep, batch, length = export_static(model, opts, own_buffers=True)
    with progress.step("compiling with AOTInductor"):
        notes.extend(compile_package(ep, src, tmp, out, opts))
    add_meta(tmp, static_meta(model, opts, batch, length))
    notes.append(
        f"static cache of {batch} row(s) × {length} positions inside the package (buffers the "
        "compiled code mutates; each loaded runner has its own, kept between calls); a smaller "
        "batch runs padded with copies of its last row (ptconvert.generate does it)"
    )
    cache = {"kind": "static", "batch_size": batch, "length": length}
    interface = {
        "call": "prog = torch._inductor.aoti_load_package(p); prog(input_ids=ids[batch, n], "
        "cache_position=arange(pos, pos + n)) → logits",
        "inputs": ["input_ids", "cache_position"],
        "outputs": ["logits"],
    }
    return cache, interface


def add_meta(package: Path, meta: dict[str, Any]) -> None:
    """``meta`` into the package as ``<archive>/extra/generation.json`` (what ``read_meta``,
    ``info`` and the runner read; the package's loader ignores it)."""
    with zipfile.ZipFile(package) as archive:
        root = archive.namelist()[0].split("/", 1)[0]
    with zipfile.ZipFile(package, "a") as archive:
        archive.writestr(f"{root}/extra/{META_NAME}", json.dumps(meta))


def open_package(path: Path, trust: bool) -> AotiStaticCache | None:
    """The stepper of an AOTI package with a static cache (``trust``: its native code loads);
    None for another package."""
    meta = read_static(path)
    return None if meta is None else AotiStaticCache(path, meta, trust)


class AotiStaticCache(StaticCacheProgram):
    """An AOTI package with a static cache, run in its own process (``formats/isolated.py``:
    compiled code's crash is an error, not ours); the process holds the loaded runner, so the
    cache buffers it mutates stay between the calls. Stepped as ``StaticCacheProgram`` is."""

    what = "package"

    def __init__(self, path: Path, meta: dict[str, Any], trust: bool = False) -> None:
        from ptconvert.formats.aoti.runtime import load as load_runtime
        from ptconvert.formats.isolated import IsolatedRuntime
        from ptconvert.scan.guard import guard

        guard(path, trust=trust)  # native code: refused without --trust (exit 11)
        self.runtime = IsolatedRuntime("aoti", str(path), load=load_runtime)
        self._sized(path, meta)

    def _run(self, input_ids: Any, cache_position: Any) -> Any:
        (logits,) = self.runtime(input_ids=input_ids.contiguous(), cache_position=cache_position)
        return logits

    def close(self) -> None:
        self.runtime.close()


# the static-cache program compiled by AOTInductor
TARGETS = [
    Target(
        AotiPackageFormat.name,
        "decoder",
        export_package,
        read_static,
        open_package,
        describe=describe_static,
    )
]
