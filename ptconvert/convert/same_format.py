"""A conversion to the source's own format: the bytes copied and compared (a program is not
exported again), refused where an option would change what a copy cannot."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ptconvert import progress
from ptconvert.atomic import atomic_path, ensure_space
from ptconvert.convert.conversion_report import ConversionReport
from ptconvert.convert.state import StepRecord
from ptconvert.errors import (
    UsageError,
    VerificationError,
)
from ptconvert.formats import Detection, describe
from ptconvert.options import Options
from ptconvert.verify.fresh_load import FreshLoad

if TYPE_CHECKING:
    pass


def copy_cannot_change(src: Path, to: str, opts: Options) -> None:
    """A file already in the format asked for is copied: options that ask for another program
    (dynamic dims, another capture method) cannot be met by a copy."""
    asked = [
        flag
        for flag, on in (
            ("--dynamic-batch", opts.dynamic_batch),
            ("--dynamic", bool(opts.dynamic)),
            ("--method", opts.method != "auto"),
            ("--quantize", bool(opts.quantize)),
        )
        if on
    ]
    if asked:
        raise UsageError(
            f"the file is already {to}: a copy cannot apply {', '.join(asked)}",
            path=src,
            hint="convert from the model's source (its weights with --model, or its Hugging "
            "Face directory) to get that program",
        )


def verified_copy(
    src: Path,
    d: Detection,
    out: Path,
    started: float,
    force: bool,
    load_timeout: float | None = None,
) -> ConversionReport:
    """The file already has the format asked for: a byte copy, checked against the source and,
    for programs, loaded in a fresh process as a user would (a TorchScript archive whose code
    runs at load tried first, stopped after ``load_timeout`` s: nothing is written then)."""
    import filecmp

    held = describe(src).files
    d.handler.load_in_time(src, load_timeout)  # code that runs at load: tried before any write
    if len(held) > 1:  # ONNX external data: its file names are written inside the model
        raise UsageError(
            f"the file is already {d.format}, with its data in "
            f"{', '.join(Path(f['path']).name for f in held[1:])}: copy the files together",
            path=src,
        )
    with atomic_path(out, replace=force) as tmp, progress.step(f"copying {d.format}"):
        ensure_space(tmp.parent, src.stat().st_size, out)
        shutil.copyfile(src, tmp)
        if not filecmp.cmp(src, tmp, shallow=False):
            raise VerificationError("the copy differs from the source", path=out)
        note = f"the source is already {d.format}: copied byte for byte and compared"
        # a copy's native code is not run: the source was never trusted
        if d.handler.kind == "program" and not d.handler.runs_native_code:
            fresh = FreshLoad(d.format, torch_only=False)
            try:
                fresh.load(tmp)
                with progress.step("loading the copy in a fresh process"):
                    fresh.finish(src)
            finally:
                fresh.stop()
            note += "; the copy loads in a fresh Python process"
    step = StepRecord(
        "copy", f"{d.format} → {d.format}", round(time.perf_counter() - started, 3), "ok"
    )
    return ConversionReport(
        str(src),
        f"{d.format}/{d.layout}",
        str(out),
        d.format,
        [f"{d.format} → {d.format}"],
        [step],
        round(time.perf_counter() - started, 3),
        [note],
        check="copy",
    )
