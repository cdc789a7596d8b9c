"""Weights conversion: any format whose weights can be read into any format that writes them
(pickle checkpoints, safetensors, sharded sets, HF directories, the weights of programs, GGUF…).

``convert_weights`` reads the source through its format (byte ranges where exact, tensors
rebuilt otherwise), writes the target through its format atomically, then reads it back and
compares every tensor bitwise with the source's independent reading.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ptconvert import progress
from ptconvert.atomic import atomic_path, check_output
from ptconvert.convert.conversion_report import ConversionReport, WeightsWritten
from ptconvert.convert.output_naming import weight_targets, weights_output, writes_directory
from ptconvert.convert.state import StepRecord
from ptconvert.errors import NoWeightsError, UnsupportedConversionError
from ptconvert.formats import FORMATS, FORMATS_BY_NAME, Detection, detect
from ptconvert.formats.safetensors import parse_size
from ptconvert.formats.weightset import WeightSet
from ptconvert.scan.guard import guard, refuse_unsafe
from ptconvert.verify.weights import verify_weights
from ptconvert.weights.read import read_weights, weight_sources


def convert_weights(
    src: str | Path,
    to: str,
    output: str | Path | None = None,
    *,
    force: bool = False,
    key: str | None = None,
    keep_prefix: bool = False,
    max_shard_size: str | None = None,
    metadata: dict[str, str] | None = None,
    skip_unsupported: bool = False,
    verify: bool = True,
    trust: bool = False,
    allow: Sequence[str] = (),
) -> ConversionReport:
    """Convert the weights in ``src`` to ``to`` (any format that writes weights): the source's
    format reads them, the target's writes them, and the check compares the output with the
    source's independent reading. The route and its steps are the graph's (``format_edges``).

    The source is scanned first (``ptconvert.scan.guard``): a dangerous file is refused, and a
    file whose loading needs user code is refused unless ``trust`` (or each of its classes is
    in ``allow``). Its tensors are read symbolically either way: nothing is unpickled.
    """
    started = time.perf_counter()
    src = Path(src)
    if to not in weight_targets():
        raise UnsupportedConversionError(f"weights cannot be written as {to!r}", path=src)
    refuse_unsafe(src.parent if src.name.endswith(".index.json") else src)
    d = detect(src)
    if d.format not in weight_sources():
        raise UnsupportedConversionError(
            f"{d.format} → {to} goes through the converter graph: use ptconvert.convert",
            path=src,
        )
    shard_bytes = parse_size(max_shard_size) if max_shard_size else None
    if shard_bytes is not None and not FORMATS_BY_NAME[to].writes_shards:
        raise UnsupportedConversionError(
            f"--max-shard-size writes {' or '.join(_shard_writers())} shards only", path=src
        )
    as_directory = writes_directory(d, to, max_shard_size, output)
    out = Path(output) if output else weights_output(d, to, as_directory)
    check_output(out, [src], force)
    steps: list[StepRecord] = []
    read = f"{d.format} → weights"
    with _step(steps, "scan", read, f"scanning {src.name}"):
        scans = guard(d.handler.scanned_as(src), trust=trust, allow=allow)
    with _step(steps, "read_weights", read, f"reading {src.name}"):
        ws = read_weights(src, key=key, keep_prefix=keep_prefix, skip_unsupported=skip_unsupported)
    fit_target(ws, to, skip_unsupported, src)
    _skipped_note(ws)
    if ws.companions and not as_directory:
        ws.notes.append(
            f"{', '.join(sorted(ws.companions))} not written: -o names one file "
            "(-o FOLDER/ writes the folder)"
        )
    write = f"weights → {to}"
    with atomic_path(out, directory=as_directory, replace=force) as tmp:
        with _step(steps, "write_weights", write, f"writing {to}"):
            files = _write(ws, d, to, tmp, as_directory, shard_bytes, metadata or {})
        check = None
        if verify:
            with _step(steps, "verify_weights", write, "verifying every tensor bitwise"):
                target = _verify_target(tmp, files, as_directory, to)
                check = verify_weights(ws, target, scans=scans, trust=trust)
    written = WeightsWritten(
        ws.path,
        len(ws.entries),
        len(ws.stored),
        sum(e.nbytes for e in ws.stored),
        [str(out / f.name) if as_directory else str(out) for f in files],
        ws.unwrapped,
        ws.stripped_prefix,
        {e.name: e.alias_of for e in ws.entries if e.alias_of is not None},
        ws.other_contents,
        check,
        ws.skipped,
    )
    return ConversionReport(
        str(src),
        f"{d.format}/{d.layout}",
        str(out),
        to,
        [read, write],
        steps,
        round(time.perf_counter() - started, 3),
        ws.notes,
        check="bitwise" if check is not None else "none",
        weights=written,
    )


@contextmanager
def _step(steps: list[StepRecord], name: str, route: str, shown: str) -> Iterator[None]:
    """A step of the route, shown while it runs and recorded with its time once it ended."""
    t0 = time.perf_counter()
    with progress.step(shown):
        yield
    steps.append(StepRecord(name, route, round(time.perf_counter() - t0, 3), "ok"))


def fit_target(ws: WeightSet, to: str, skip_unsupported: bool, src: Path) -> None:
    """With ``skip_unsupported``, tensors whose dtype the target cannot hold are left out with
    their aliases and reported; without it the writer names each of them in its error."""
    target = FORMATS_BY_NAME[to]
    if not skip_unsupported:
        return
    bad = {e.name: e.dtype for e in ws.entries if not target.holds_dtype(e.dtype)}
    for name, dtype in bad.items():
        ws.skipped[name] = f"dtype {dtype}, which {to} cannot hold"
    ws.entries = [e for e in ws.entries if e.name not in bad and e.alias_of not in bad]
    if not ws.entries:
        listed = ", ".join(f"{n!r} ({dt})" for n, dt in list(bad.items())[:10])
        raise NoWeightsError(
            f"no tensors left once those {to} cannot hold are left out: {listed}", path=src
        )


def _skipped_note(ws: WeightSet) -> None:
    if ws.skipped:
        ws.notes.append(f"left out {len(ws.skipped)} tensors (--skip-unsupported): {ws.skipped}")


def _write(
    ws: WeightSet,
    d: Detection,
    to: str,
    tmp: Path,
    as_directory: bool,
    shard_bytes: int | None,
    metadata: dict[str, str],
) -> list[Path]:
    target = FORMATS_BY_NAME[to]
    if not as_directory:
        return target.write_weights(ws, tmp, metadata=metadata)
    # a folder: the source's files kept beside its weights, the files made from it, the weights
    for item in d.handler.kept_files(d.path):
        shutil.copy2(item, tmp / item.name)
    for name, data in ws.companions.items():
        (tmp / name).write_bytes(data)
    if shard_bytes is not None:
        return target.write_weights(ws, tmp, max_shard_size=shard_bytes, metadata=metadata)
    return target.write_weights(ws, tmp / target.folder_file, metadata=metadata)


def _shard_writers() -> list[str]:
    return [f.name for f in FORMATS if f.writes_shards]


def _verify_target(tmp: Path, files: list[Path], as_directory: bool, to: str) -> Path:
    if not as_directory:
        return tmp
    index = next((f for f in files if f.name.endswith(".index.json")), None)
    return index or files[0]
