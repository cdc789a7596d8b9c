"""AOTInductor packages (``aoti``): a pt2 archive whose ``data/aotinductor/<model>/`` holds the
compiled wrapper (a shared library with the weights embedded), its kernels and their generated
C++ source. ``info`` reads the package without loading it: the libraries that run when it loads,
the target it was compiled for, and from the generated source the constants it embeds (their
original names, dtypes, shapes) and its inputs and outputs; ``open`` runs it in a process of its
own (native code: a crash is an error, not ours)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

from ptconvert.archive import open_zip
from ptconvert.formats.aoti.options import AotiOptions
from ptconvert.formats.aoti.runtime import load as load_runtime
from ptconvert.formats.base import FileInfo, Format, IOSpec, Need, Probe, file_entry
from ptconvert.formats.isolated import IsolatedRuntime
from ptconvert.formats.program import Program, Signature
from ptconvert.formats.pt2 import is_pt2


def compiler() -> str | None:
    """The C++ compiler Inductor would use (its ``CXX`` or the first on PATH)."""
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def _has_compiler(src_format: str, opts: object) -> bool:
    return compiler() is not None


class AotiPackageFormat(Format):
    name = "aoti"
    kind = "program"
    suffixes = (".pt2",)
    loader_needs_suffix = True
    output_suffix = ".aoti.pt2"
    # a package ptconvert writes checks its inputs itself (edges/compile.py): said where it loads
    load_line = (
        "prog = torch._inductor.aoti_load_package(p)  # checks every call's input dtypes, "
        "shapes and strides (no AOTI_RUNTIME_CHECK_INPUTS needed)"
    )
    runs_native_code = True
    isolated = True
    options_class = AotiOptions
    needs = (
        Need(
            "cpp_compiler",
            "install a C++ compiler (g++ or clang++) or set CXX: AOTInductor compiles the "
            "program into native code with it",
            _has_compiler,
        ),
    )
    bounds_dims = True
    quantize_why = (
        "torchao's int8 tensors through AOTInductor's compile are not checked here yet "
        "(--to pt2 holds them)"
    )
    holds = "an AOTInductor package: compiled native code (.so) with embedded weights"
    priority = 40

    def open(self, path: Path, device: str = "cpu") -> Program:
        # compiled native code: it runs in its own process (a crash is an error, not ours)
        runtime = IsolatedRuntime(self.name, str(path), device, load=load_runtime)
        names = runtime.input_names
        signature = None if names is None else Signature(names, list(names), source="package")
        return Program(runtime, signature)

    def match(self, probe: Probe) -> str | None:
        if not is_pt2(probe) or probe.zip is None:
            return None
        if any("/data/aotinductor/" in n for n in probe.zip.names):
            return "package"
        return None

    def info(self, path: Path, layout: str) -> FileInfo:
        archive = open_zip(path)
        info = FileInfo(str(path), self.name, layout, path.stat().st_size, [file_entry(path)])
        libs = [m.name for m in archive.members if m.name.endswith(".so")]
        info.native_code = libs
        info.notes.append("loading runs the compiled native code in these shared libraries")
        models = sorted(
            {
                m.name.split("/data/aotinductor/", 1)[1].split("/", 1)[0]
                for m in archive.members
                if "/data/aotinductor/" in m.name
            }
        )
        info.metadata["models"] = models
        for m in archive.members:
            if m.name.endswith("wrapper_metadata.json"):
                info.metadata["target"] = json.loads(archive.read(m))
            elif m.name.endswith(".wrapper.cpp"):  # the generated source, beside its library
                _describe_wrapper(info, archive.read(m).decode("utf-8", "replace"))
        if info.tensors is None:
            info.notes.append("no generated source in the package: its constants are not listed")
        return info


# what the generated wrapper declares of each constant, input and output (inductor's
# cpp_wrapper_cpu.py writes these lines): `constants_info_[0].original_fqn = "fc1.weight";`
_INFO_LINE = re.compile(
    r"^\s*(constants|inputs|outputs)_info_\[(\d+)\]\.(\w+)\s*=\s*(.*?);\s*$", re.M
)
_DTYPE = re.compile(r"cached_torch_dtype_(\w+)")


def _describe_wrapper(info: FileInfo, source: str) -> None:
    """The constants (tensors of ``info``, under the module's own names), inputs and outputs a
    generated wrapper declares."""
    fields: dict[tuple[str, int], dict[str, str]] = {}
    for kind, index, key, value in _INFO_LINE.findall(source):
        fields.setdefault((kind, int(index)), {})[key] = value.strip()

    def of(kind: str) -> list[dict[str, str]]:
        return [f for (k, _), f in sorted(fields.items()) if k == kind]

    constants: list[tuple[str, str, list[int | str], int]] = []
    for c in of("constants"):
        name = _string(c.get("original_fqn", "")) or _string(c.get("name", ""))
        m = _DTYPE.search(c.get("dtype", ""))
        dims = [int(d) for d in re.findall(r"-?\d+", c.get("shape", ""))]
        constants.append((name, m.group(1) if m else "?", list(dims), math.prod(dims)))
    if constants:
        info.add_tensors(constants)
        info.notes.append(
            f"{len(constants)} constants embedded in the library (a constant the compiler "
            "folded into its kernels is not listed)"
        )
    info.inputs = [IOSpec(_string(i.get("name", "")), None, None) for i in of("inputs")]
    info.outputs = [IOSpec(_string(o.get("name", "")), None, None) for o in of("outputs")]


def _string(literal: str) -> str:
    return literal[1:-1] if len(literal) >= 2 and literal[0] == literal[-1] == '"' else literal
