"""The format registry: detection by content and ``info`` for every format ptconvert knows.

Detection has two stages (as Netron does it): negative signatures first (an empty file, a Git LFS
pointer, an HTML page, a truncated zip), then every format's cheap ``match`` on the content; the
highest ``priority`` wins and the file suffix only breaks ties. Adding a format is adding one
module and one line to ``FORMATS`` (or, from another package, a plugin: ``ptconvert.plugins``).
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import NoReturn

from ptconvert.deps import declare_extra
from ptconvert.errors import (
    EmptyFileError,
    HtmlPageError,
    InputError,
    LfsPointerError,
    NoWeightsError,
    TruncatedFileError,
    UnknownFormatError,
    named_error,
)
from ptconvert.formats.aoti import AotiPackageFormat
from ptconvert.formats.base import _REGISTRY_DESCRIBE, FileInfo, Format, Probe
from ptconvert.formats.gguf import GgufFormat
from ptconvert.formats.hf import (
    WEIGHT_NAMES,
    HuggingFaceFormat,
    generation_layout,
    read_config,
)
from ptconvert.formats.onnx import OnnxFormat
from ptconvert.formats.pt import PtFormat
from ptconvert.formats.pt2 import ExportedProgramFormat
from ptconvert.formats.pte import PteFormat
from ptconvert.formats.safetensors import SafetensorsFormat
from ptconvert.formats.sharded import ShardedFormat
from ptconvert.formats.torchscript import TorchScriptFormat
from ptconvert.report import Report

FORMATS: list[Format] = [
    PtFormat(),
    SafetensorsFormat(),
    ShardedFormat(),
    TorchScriptFormat(),
    ExportedProgramFormat(),
    AotiPackageFormat(),
    OnnxFormat(),
    HuggingFaceFormat(),
    PteFormat(),
    GgufFormat(),
]
FORMATS_BY_NAME: dict[str, Format] = {f.name: f for f in FORMATS}
for _f in FORMATS:
    declare_extra(_f.packages, _f.extra)


def target_options() -> dict[str, type]:
    """Each target's own option (``Format.options_class``'s fields, e.g. ``opset``) by name: the
    class that declares it."""
    return {
        f.name: fmt.options_class
        for fmt in FORMATS
        if fmt.options_class is not None
        for f in fields(fmt.options_class)
    }


def register_format(fmt: Format) -> None:
    """Add a format (a plugin's) to the registry: detection, ``info`` and ``formats`` see it."""
    from ptconvert.errors import UsageError
    from ptconvert.options import Options

    if fmt.name in FORMATS_BY_NAME:
        raise UsageError(f"a format named {fmt.name!r} is registered already")
    taken = {f.name for f in fields(Options)} | set(target_options())
    own = {f.name for f in fields(fmt.options_class)} if fmt.options_class else set()
    clash = sorted(taken & own)
    if clash:
        raise UsageError(f"format {fmt.name!r} declares options that exist already: {clash}")
    FORMATS.append(fmt)  # in place: modules that imported the list see it
    FORMATS_BY_NAME[fmt.name] = fmt
    declare_extra(fmt.packages, fmt.extra)


@dataclass(frozen=True)
class Detection(Report):
    path: Path
    format: str
    layout: str

    @property
    def handler(self) -> Format:
        return FORMATS_BY_NAME[self.format]


def detect(path: str | Path) -> Detection:
    """Recognise ``path`` from its content. Raises an InputError subclass saying what was seen."""
    path = Path(path)
    if not path.exists():
        _missing(path)
    probe = Probe(path)
    if not probe.is_dir:
        _reject_non_models(probe)
    matches = [(f, layout) for f in FORMATS if (layout := f.match(probe)) is not None]
    if matches:
        suffix = path.name.lower()
        best = max(
            matches,
            key=lambda m: (m[0].priority, any(suffix.endswith(s) for s in m[0].suffixes)),
        )
        return Detection(path, best[0].name, best[1])
    raise _unknown(probe)


def _missing(path: Path) -> NoReturn:
    """Why ``path`` is not there: a symbolic link loop, a link to nothing, or nothing."""
    try:
        path.stat()
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise named_error(exc, path) or exc from None
    if path.is_symlink():
        raise InputError(f"a symbolic link to nothing ({os.readlink(path)})", path=path)
    raise InputError("no such file or directory", path=path)


def describe(path: str | Path) -> FileInfo:
    """``ptconvert info``: what a file or directory holds, without executing anything."""
    folder = generation_layout(Path(path)) if Path(path).is_dir() else None
    if folder is not None:  # a generation export's folder: described, never converted from
        hf = FORMATS_BY_NAME["hf"]
        assert isinstance(hf, HuggingFaceFormat)
        return hf.generation_info(Path(path), folder, read_config(Path(path)))
    d = detect(path)
    info = d.handler.info(d.path, d.layout)
    info.notes += _past_scan_limit(d.path)
    return info


_REGISTRY_DESCRIBE.append(describe)  # formats describe their parts through it


# members the security scan reads whole: pickles, TorchScript code, a pt2's graphs
_SCANNED = re.compile(r"(\.pkl|\.pickle|\.debug_pkl|/code/.*\.py|/models/.*\.json)$")


def _past_scan_limit(path: Path) -> list[str]:
    """What ``convert`` refuses before reading it, said by ``info`` too: a zip member the scan
    must read whole that holds more than it reads (``archive.MAX_INFLATED``)."""
    from ptconvert.archive import MAX_INFLATED, is_zip, open_zip

    if not path.is_file():
        return []
    with open(path, "rb") as fh:
        if not is_zip(fh.read(4)):
            return []
    return [
        f"zip member {m.name!r} holds {m.size:,} bytes, past the {MAX_INFLATED >> 20} MiB the "
        "security scan reads of one member: convert refuses the file"
        for m in open_zip(path).members
        if m.size > MAX_INFLATED and _SCANNED.search(m.name.lower())
    ]


def _reject_non_models(probe: Probe) -> None:
    head = probe.head
    if probe.size == 0:
        raise EmptyFileError(
            "the file is empty (0 bytes)", path=probe.path, hint="re-download or re-save it"
        )
    if not head.strip(b"\0"):
        raise EmptyFileError(
            f"the file holds only zero bytes ({probe.size} bytes)", path=probe.path
        )
    text = head.lstrip()[:256]
    if text.startswith(b"version https://git-lfs") or b"\noid sha256:" in text:
        raise LfsPointerError(
            "this is a Git LFS pointer, not the model file it stands for",
            path=probe.path,
            hint="fetch the real file with `git lfs pull` (or download it again)",
        )
    lowered = text.lower()
    if lowered.startswith((b"<!doctype html", b"<html", b"<head", b"<?xml")) or b"<html" in lowered:
        raise HtmlPageError(
            "this is an HTML page, not a model (a failed or redirected download?)",
            path=probe.path,
            hint="download the file again from its direct link",
        )
    if head.startswith(b"PK\x03\x04") and probe.zip is None:
        raise TruncatedFileError(
            "zip archive without a readable central directory: the file is truncated or corrupt",
            path=probe.path,
            hint="re-download or re-save it",
        )


def _unknown(probe: Probe) -> InputError:
    tried = ", ".join(f.name for f in FORMATS)
    if probe.is_dir and (folder := generation_layout(probe.path)) is not None:
        return NoWeightsError(
            f"a generation export's folder ({folder}: its programs beside config.json, no "
            "weights file): `info`, `bench` and ptconvert.generate take it, nothing converts "
            "from it",
            path=probe.path,
            hint="convert the Hugging Face directory it was exported from",
        )
    if probe.is_dir:
        present = sorted(p.name for p in probe.path.iterdir())[:20]
        return NoWeightsError(
            f"directory holds no model weights (looked for {', '.join(WEIGHT_NAMES)} "
            f"beside config.json; found {present or 'nothing'})",
            path=probe.path,
            hint="point ptconvert at the weights file itself, or at a directory with config.json "
            "and weights",
        )
    if probe.zip is not None:
        members = probe.zip.names[:12]
        return UnknownFormatError(
            f"zip archive with no recognisable members (saw {members}); tried: {tried}",
            path=probe.path,
        )
    first = probe.head[:16]
    return UnknownFormatError(
        f"unrecognised content: first bytes {first.hex(' ')} ({first!r}); tried: {tried}",
        path=probe.path,
    )


__all__ = ["FORMATS", "Detection", "FileInfo", "describe", "detect"]
