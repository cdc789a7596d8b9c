"""Finding every pickle stream in a file, whatever holds it.

Containers are recognised by content, never by name: zip archives (torch checkpoints,
TorchScript, pt2 and AOTI archives, npz) are read the way torch reads them and every member is
sniffed; tar and gzip are opened; nested archives recurse up to a depth and size limit. A raw
file that opens like a pickle is read as every concatenated pickle in it (the legacy torch
layout is five of them, then raw storages). ``.npy`` object arrays carry a pickle after their
header. What cannot be opened completely is reported, never passed as clean.
"""

from __future__ import annotations

import ast
import gzip
import io
import mmap
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ptconvert.archive import ZipArchive, looks_like_zip, open_zip
from ptconvert.errors import InputError
from ptconvert.scan.machine import run_pickle

MAX_DEPTH = 4
MAX_INFLATED = 4 << 30  # bytes a compressed member may expand to before we refuse it


@dataclass
class Stream:
    """A byte string that may hold pickles, and where it came from."""

    label: str
    data: bytes | mmap.mmap
    kind: str  # "pickle" | "maybe-pickle" | "npy-object" | "tar-storages" | "tar-tensors"
    start: int = 0
    torchscript: bool = False  # inside a TorchScript archive (``__torch__`` classes are its own)


@dataclass
class Problem:
    label: str
    severity: str  # "error" | "dangerous" | "needs-code"
    reason: str


def walk(path: Path) -> Iterator[Stream | Problem]:
    """Every pickle stream (and every container problem) in the file at ``path``."""
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        if size == 0:
            return
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    yield from _walk_bytes(str(path), mm, path, 0)


def _walk_bytes(
    label: str, data: bytes | mmap.mmap, path: Path | None, depth: int, torchscript: bool = False
) -> Iterator[Stream | Problem]:
    head = bytes(data[:512])
    if depth > MAX_DEPTH:
        yield Problem(label, "error", f"archives nested deeper than {MAX_DEPTH} levels")
        return
    if head.startswith(b"7z\xbc\xaf\x27\x1c"):
        yield Problem(label, "error", "7z archive: its members cannot be scanned")
        return
    tail = bytes(data[-65557:])
    if looks_like_zip(head, tail):
        yield from _walk_zip(label, data, path, depth)
        return
    if head.startswith(b"\x1f\x8b"):
        try:
            inflated = _inflate_gzip(data)
        except (OSError, EOFError, ValueError) as exc:
            yield Problem(label, "error", f"gzip stream cannot be read ({exc})")
            return
        yield from _walk_bytes(f"{label}!gunzip", inflated, None, depth + 1)
        return
    if len(head) > 262 and head[257:262] == b"ustar":
        yield from _walk_tar(label, data, depth)
        return
    if head.startswith(b"\x93NUMPY"):
        yield from _walk_npy(label, data)
        return
    if looks_like_pickle(head):
        yield Stream(label, data, "pickle", torchscript=torchscript)
    elif depth == 0 and not _known_data_file(head, path):
        # torch.load unpickles any file that is not a zip: a pickle may open with any opcode
        yield Stream(label, data, "maybe-pickle")


def _known_data_file(head: bytes, path: Path | None) -> bool:
    """safetensors (header validated) or ONNX: formats that hold no pickle."""
    if len(head) >= 9 and head[5:8] == b"\0\0\0" and head[8:9] == b"{" and path is not None:
        from ptconvert.formats.safetensors import read_header

        read_header(path)  # raises InputError for a broken header: reported as unreadable
        return True
    return len(head) >= 3 and head[0] == 0x08 and head[1] < 0x20 and head[2] in (0x12, 0x1A, 0x3A)


def _inflate_gzip(data: bytes | mmap.mmap) -> bytes:
    with gzip.GzipFile(fileobj=io.BytesIO(bytes(data))) as gz:
        out = gz.read(MAX_INFLATED + 1)
    if len(out) > MAX_INFLATED:
        raise ValueError("expands past the size limit")
    return out


def _walk_zip(
    label: str, data: bytes | mmap.mmap, path: Path | None, depth: int
) -> Iterator[Stream | Problem]:
    tmp: Path | None = None
    if path is None:  # nested archive: the zip reader works on files
        import tempfile

        fd, name = tempfile.mkstemp(suffix=".zip")
        with open(fd, "wb") as fh:
            fh.write(data)
        tmp = path = Path(name)
    try:
        try:
            archive = open_zip(path)
        except InputError as exc:
            yield Problem(label, "error", f"zip archive cannot be read: {exc.message}")
            return
        names = [m.name for m in archive.members]
        torchscript = any(n.endswith("/constants.pkl") or "/code/" in n for n in names)
        storages = _referenced_storages(archive)
        for anomaly in archive.anomalies:
            ambiguous = "appears more than once" in anomaly
            # torch and other readers may pick different copies: refuse rather than guess
            sev = "error" if ambiguous else "info"
            if sev == "error":
                yield Problem(label, sev, f"ambiguous zip archive: {anomaly}")
        for m in archive.members:
            if m.is_dir:
                continue
            member_label = f"{label}:{m.name}"
            if m.name in storages:
                continue  # a storage data.pkl references: torch reads it as raw bytes
            if m.name.endswith(".so") or archive.read(m, 4) == b"\x7fELF":
                # AOTInductor packages: loading dlopens this library and runs its code
                yield Problem(
                    member_label,
                    "needs-code",
                    "native code: a shared library that runs when loaded",
                )
                continue
            if m.size > MAX_INFLATED:
                if m.name.endswith(".pkl"):
                    yield Problem(member_label, "error", "pickle member larger than the limit")
                continue
            try:
                head = archive.read(m, 512)
            except InputError as exc:
                yield Problem(member_label, "error", exc.message)
                continue
            if not _interesting(head, m.name):
                continue
            try:
                body = archive.read(m)
            except InputError as exc:
                yield Problem(member_label, "error", exc.message)
                continue
            yield from _walk_bytes(member_label, body, None, depth + 1, torchscript)
        if not names:
            yield Problem(label, "error", "zip archive has no members")
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


# Members torch reads as raw bytes, never as a pickle: the storages data.pkl references, and the
# weights and tensor constants of a pt2 archive. Scanning their bytes as pickles would only raise
# false alarms; a pickled pt2 weight (``use_pickle``) is a torch.save zip and is still scanned,
# and so is any storage-named member that data.pkl does not reference.
_RAW_DATA = re.compile(r"(^|/)(data/weights/weight_\d+|data/constants/tensor_\d+)$")
_PROTO0_GLOBAL = re.compile(rb"^c[A-Za-z_][\w.]*\n[A-Za-z_][\w.]*\n")
_PROTO0_START = re.compile(rb"^[(}\]][(dltSIVFcpgqh.NK}\])]")


def looks_like_pickle(head: bytes) -> bool:
    """A strict sniff: a protocol 2+ header, or protocol 0/1 opcodes that parse as such."""
    if len(head) >= 2 and head[0] == 0x80 and head[1] <= 5:
        return True
    return bool(_PROTO0_GLOBAL.match(head) or _PROTO0_START.match(head))


def _interesting(head: bytes, name: str) -> bool:
    """Whether a member could hold a pickle or a nested archive (by content; .pkl by name)."""
    if name.endswith((".pkl", ".pickle", ".debug_pkl")):
        return True
    if _RAW_DATA.search(name):
        return head.startswith(b"PK\x03\x04")
    if looks_like_pickle(head):
        return True
    return head.startswith((b"PK\x03\x04", b"\x1f\x8b", b"\x93NUMPY", b"7z\xbc\xaf")) or (
        len(head) > 262 and head[257:262] == b"ustar"
    )


def _referenced_storages(archive: ZipArchive) -> set[str]:
    """The ``<root>/data/<key>`` members that data.pkl's persistent ids point at."""
    root = archive.root()
    member = archive.member(root + "data.pkl")
    if member is None or member.size > MAX_INFLATED:
        return set()
    try:
        run = run_pickle(archive.read(member))
    except InputError:
        return set()
    out = set()
    for e in run.events:
        pid = e.target.pid if e.kind == "persid" else None
        if isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage":
            out.add(f"{root}data/{pid[2]}")
    return out


def _walk_tar(label: str, data: bytes | mmap.mmap, depth: int) -> Iterator[Stream | Problem]:
    try:
        with tarfile.open(fileobj=io.BytesIO(bytes(data)), mode="r:") as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
            legacy = {"sys_info", "pickle", "tensors", "storages"} <= {m.name for m in members}
            for member in members:
                f = tar.extractfile(member)
                if f is None:
                    continue
                body = f.read()
                member_label = f"{label}:{member.name}"
                if legacy and member.name in ("storages", "tensors"):
                    # torch reads these as pickled records between raw binary fields
                    yield Stream(member_label, body, f"tar-{member.name}")
                else:
                    yield from _walk_bytes(member_label, body, None, depth + 1)
    except tarfile.TarError as exc:
        yield Problem(label, "error", f"tar archive cannot be read ({exc})")


def _walk_npy(label: str, data: bytes | mmap.mmap) -> Iterator[Stream | Problem]:
    try:
        major = data[6]
        if major == 1:
            hlen, start = int.from_bytes(data[8:10], "little"), 10
        else:
            hlen, start = int.from_bytes(data[8:12], "little"), 12
        header = ast.literal_eval(bytes(data[start : start + hlen]).decode("latin-1"))
        descr = str(header["descr"])
    except (ValueError, SyntaxError, KeyError, TypeError, IndexError) as exc:
        yield Problem(label, "error", f".npy header cannot be read ({exc})")
        return
    if "O" in descr:  # object arrays are pickled after the header
        yield Stream(label, data, "npy-object", start + hlen)
