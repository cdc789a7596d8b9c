"""The exported → aoti edge: ``torch._inductor.aoti_compile_and_package`` into a ``.pt2`` package.

The package holds a shared library compiled for one device (``--device``), with the program's
dynamic dims kept; ``--aoti-option k=v`` passes Inductor configs (``max_autotune=1``). Compiling
takes tens of seconds even for a small model: the time is reported.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ptconvert.convert.state import RunState
from ptconvert.errors import UnsupportedConversionError
from ptconvert.options import Options
from ptconvert.quiet import quiet_torch
from ptconvert.verify.check import require_device


def compiler() -> str | None:
    """The C++ compiler Inductor would use (its ``CXX`` or the first on PATH)."""
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def aoti_compile(state: RunState, opts: Options) -> None:
    from torch._inductor import aoti_compile_and_package

    assert state.exported is not None and state.output is not None
    require_device(opts.device)
    ep: Any = state.exported
    if opts.device != "cpu":
        from torch.export.passes import move_to_device_pass

        ep = move_to_device_pass(ep, opts.device)
    # under the output's own name (the archive's folder is named after the file; torch wants
    # .pt2), in a folder beside it, then moved onto the temporary output
    final = (state.destination or state.output).name
    folder = Path(tempfile.mkdtemp(prefix=".aoti.", dir=state.output.parent))
    package = folder / (final if final.endswith(".pt2") else f"{final}.pt2")
    started = time.perf_counter()
    try:
        with quiet_torch():
            aoti_compile_and_package(
                ep, package_path=str(package), inductor_configs=dict(opts.aoti_options)
            )
        os.replace(package, state.output)
    except Exception as exc:  # Inductor's errors are long: the first line says what failed
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise UnsupportedConversionError(
            f"AOTInductor cannot compile this program: {type(exc).__name__}: {first}",
            path=state.src,
        ) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    options = ", ".join(f"{k}={v}" for k, v in opts.aoti_options.items())
    state.notes.append(
        f"AOTInductor compiled for {opts.device} in {time.perf_counter() - started:.1f} s"
        + (f" ({options})" if options else "")
        + "; the package holds native code: loading it runs a compiled shared library"
    )
