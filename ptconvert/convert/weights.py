"""Weights conversion between pickle checkpoints, safetensors, sharded sets and HF directories.

``convert_weights`` reads the source (byte ranges where exact, torch.load(weights_only=True)
otherwise), writes the target atomically, then reads it back and compares every tensor bitwise.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ptconvert import progress
from ptconvert.atomic import atomic_path, check_output
from ptconvert.errors import NoWeightsError, UnsupportedConversionError
from ptconvert.formats import detect
from ptconvert.formats.hf import WEIGHT_NAMES
from ptconvert.formats.safetensors import TORCH_TO_SAFETENSORS
from ptconvert.formats.sharded import read_index
from ptconvert.report import Check, Report
from ptconvert.scan.guard import guard, refuse_unsafe
from ptconvert.verify.weights import WeightsCheck, verify_weights
from ptconvert.weights.read import WeightSet, read_weights, weight_sources
from ptconvert.weights.torch_zip import write_torch_zip
from ptconvert.weights.write import parse_size, write_safetensors

WEIGHT_TARGETS = ("safetensors", "pt")


@dataclass
class WeightsReport(Report):
    source: str
    source_format: str
    output: str
    target_format: str
    path: str  # "fast" (kernel byte copies) or "torch"
    tensors: int
    stored: int
    bytes: int
    files: list[str]
    seconds: float
    unwrapped: str | None = None
    stripped_prefix: str | None = None
    aliases: dict[str, str] = field(default_factory=dict)
    other_contents: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    verification: WeightsCheck | None = None
    skipped: dict[str, str] = field(default_factory=dict)  # left out (--skip-unsupported): why
    check: Check = "bitwise"  # the check that ran: "bitwise" (read back, compared) or "none"


def default_output(src: Path, fmt: str, source_format: str, sharded: bool) -> Path:
    if source_format == "hf" or sharded:
        return src.parent / f"{src.name.split('.')[0]}-{fmt}"
    if source_format == "sharded":
        return src.parent.parent / f"{src.parent.name}-{fmt}"
    return src.with_suffix(".safetensors" if fmt == "safetensors" else ".pt")


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
) -> WeightsReport:
    """Convert the weights in ``src`` to ``to`` (``safetensors`` or ``pt``).

    The source is scanned first (``ptconvert.scan.guard``): a dangerous file is refused, and a
    file whose loading needs user code is refused unless ``trust`` (or each of its classes is
    in ``allow``). Its tensors are read symbolically either way: nothing is unpickled.
    """
    started = time.perf_counter()
    src = Path(src)
    if to not in WEIGHT_TARGETS:
        raise UnsupportedConversionError(f"weights cannot be written as {to!r}", path=src)
    refuse_unsafe(src.parent if src.name.endswith(".index.json") else src)
    d = detect(src)
    if d.format not in weight_sources():
        raise UnsupportedConversionError(
            f"{d.format} → {to} goes through the converter graph: use ptconvert.convert",
            path=src,
        )
    shard_bytes = parse_size(max_shard_size) if max_shard_size else None
    if shard_bytes is not None and to != "safetensors":
        raise UnsupportedConversionError(
            "--max-shard-size writes safetensors shards only", path=src
        )
    out = Path(output) if output else default_output(src, to, d.format, shard_bytes is not None)
    check_output(out, [src], force)
    with progress.step(f"scanning {src.name}"):
        scans = guard(src.parent if d.format == "sharded" else src, trust=trust, allow=allow)
    with progress.step(f"reading {src.name}"):
        ws = read_weights(src, key=key, keep_prefix=keep_prefix, skip_unsupported=skip_unsupported)
    fit_target(ws, to, skip_unsupported, src)
    _skipped_note(ws)
    as_directory = d.format == "hf" or shard_bytes is not None
    with atomic_path(out, directory=as_directory, replace=force) as tmp:
        with progress.step(f"writing {to}"):
            files = _write(ws, src, d.format, to, tmp, shard_bytes, metadata or {})
        check = None
        if verify:
            with progress.step("verifying every tensor bitwise"):
                target = _verify_target(tmp, files, as_directory, to)
                check = verify_weights(ws, target, scans=scans, trust=trust)
    return WeightsReport(
        str(src),
        f"{d.format}/{d.layout}",
        str(out),
        to,
        ws.path,
        len(ws.entries),
        len(ws.stored),
        sum(e.nbytes for e in ws.stored),
        [str(out / f.name) if as_directory else str(out) for f in files],
        round(time.perf_counter() - started, 3),
        ws.unwrapped,
        ws.stripped_prefix,
        {e.name: e.alias_of for e in ws.entries if e.alias_of is not None},
        ws.other_contents,
        ws.notes,
        check,
        ws.skipped,
        "bitwise" if check is not None else "none",
    )


def fit_target(ws: WeightSet, to: str, skip_unsupported: bool, src: Path) -> None:
    """With ``skip_unsupported``, tensors whose dtype the target cannot hold are left out with
    their aliases and reported; without it the writer names each of them in its error."""
    if to != "safetensors" or not skip_unsupported:
        return  # a torch checkpoint holds every dtype torch has
    bad = {e.name: e.dtype for e in ws.entries if e.dtype not in TORCH_TO_SAFETENSORS}
    for name, dtype in bad.items():
        ws.skipped[name] = f"dtype {dtype}, which safetensors cannot hold"
    ws.entries = [e for e in ws.entries if e.name not in bad and e.alias_of not in bad]
    if not ws.entries:
        listed = ", ".join(f"{n!r} ({dt})" for n, dt in list(bad.items())[:10])
        raise NoWeightsError(
            f"no tensors left once those safetensors cannot hold are left out: {listed}", path=src
        )


def _skipped_note(ws: WeightSet) -> None:
    if ws.skipped:
        ws.notes.append(f"left out {len(ws.skipped)} tensors (--skip-unsupported): {ws.skipped}")


def _write(
    ws: WeightSet,
    src: Path,
    source_format: str,
    to: str,
    tmp: Path,
    shard_bytes: int | None,
    metadata: dict[str, str],
) -> list[Path]:
    if source_format != "hf":
        if to == "pt":
            return write_torch_zip(ws, tmp)
        return write_safetensors(ws, tmp, max_shard_size=shard_bytes, metadata=metadata)
    # a Hugging Face directory: copy everything but the weights, then write the weights
    skip = set(WEIGHT_NAMES)
    for name in WEIGHT_NAMES:
        if name.endswith(".index.json") and (src / name).exists():
            skip |= set(read_index(src / name)["weight_map"].values())
    for item in sorted(src.iterdir()):
        if item.name not in skip and item.is_file():
            shutil.copy2(item, tmp / item.name)
    if to == "pt":
        return write_torch_zip(ws, tmp / "pytorch_model.bin")
    if shard_bytes is None:
        return write_safetensors(ws, tmp / "model.safetensors", metadata=metadata)
    return write_safetensors(ws, tmp, max_shard_size=shard_bytes, metadata=metadata)


def _verify_target(tmp: Path, files: list[Path], as_directory: bool, to: str) -> Path:
    if not as_directory:
        return tmp
    index = next((f for f in files if f.name.endswith(".index.json")), None)
    return index or files[0]
