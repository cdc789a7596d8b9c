"""Finding every pickle stream in a file, whatever holds it.

Containers are recognised by content, never by name: zip archives (torch checkpoints,
TorchScript, pt2 and AOTI archives, npz) are read the way torch reads them and every member is
sniffed; tar and gzip are opened; nested archives recurse up to a depth and size limit. A raw
file that opens like a pickle is read as every concatenated pickle in it (the legacy torch
layout is five of them, then raw storages). ``.npy`` object arrays carry a pickle after their
header. What cannot be opened completely is reported, never passed as clean.
"""

from __future__ import annotations

import bz2
import io
import lzma
import mmap
import os
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# an expansion past MAX_RATIO once past RATIO_FLOOR is a bomb: the limits convert applies
from ptconvert.archive import (
    MAX_INFLATED,
    MAX_RATIO,
    RATIO_FLOOR,
    ZipArchive,
    ZipMember,
    has_zip_tail,
    is_tar,
    is_zip,
    open_zip,
)
from ptconvert.errors import InputError
from ptconvert.formats import FORMATS
from ptconvert.formats.base import Format
from ptconvert.formats.onnx import is_onnx
from ptconvert.hub import links_into_blobs
from ptconvert.pickles.machine import run_pickle
from ptconvert.report import Verdict

MAX_DEPTH = 4
_STEP = 16 << 20  # output taken per decompress call
_CHUNK = 1 << 20


@dataclass
class Stream:
    """A byte string that may hold pickles, and where it came from."""

    label: str
    data: bytes | mmap.mmap
    # "pickle" | "maybe-pickle" | "npy-object" | "tar-storages" | "tar-tensors" | "from-byte-0"
    # ("from-byte-0": the bytes of a file read as something else, as the pickle that torch.load,
    # given them in memory, or pickle.load reads from byte 0)
    kind: str
    start: int = 0
    torchscript: bool = False  # inside a TorchScript archive (``__torch__`` classes are its own)


@dataclass
class Problem:
    label: str
    severity: Verdict  # "error" | "dangerous" | "needs-code"
    reason: str


# How a byte string is read by whoever loads it:
# - "load": a file, as torch.load / joblib.load would read it (zip at byte 0, else tar, else
#   pickles from byte 0); when it is read as something else (a tar, safetensors, ...), also as
#   the pickle that torch.load of its bytes in memory, or pickle.load, reads from byte 0;
# - "nested": bytes a pickle hands to torch.load in memory (``torch.storage._load_from_bytes``:
#   ``torch.load(io.BytesIO(b))``): a zip at byte 0, else pickles from byte 0, never a tar;
# - "pickle": unpickled by name whatever its first bytes (data.pkl, constants.pkl, ...);
# - "member": a member of an archive nobody unpickles by name: opened when its content is an
#   archive, a compressed stream or a pickle.
LOAD, NESTED, PICKLE, MEMBER = "load", "nested", "pickle", "member"
FROM_BYTE_0 = "from-byte-0"


def walk(path: Path) -> Iterator[Stream | Problem]:
    """Every pickle stream (and every container problem) in the file at ``path``."""
    mm = _map(path)
    if mm is not None:
        yield from _walk_bytes(str(path), mm, path, 0, LOAD)


def walk_source(path: Path) -> Iterator[Stream]:
    """A file that is code (Python source): only the pickle torch.load would read from byte 0."""
    mm = _map(path)
    if mm is not None:
        yield _from_byte_0(str(path), mm)


def opens_as_archive(path: Path) -> bool:
    """Whether a loader opens the file as an archive, a compressed stream or an array (zip,
    7z, tar, gzip/zlib/bz2/xz/lzma, npy), as the walk does: a model file even when it holds no
    pickle. The first bytes decide, and tarfile where they are not enough."""
    mm = _map(path)
    if mm is None:
        return False
    with mm:
        head = bytes(mm[:512])
        return (
            is_zip(head)
            or head.startswith((b"7z\xbc\xaf\x27\x1c", b"\x93NUMPY"))
            or _decompressor(head) is not None
            or tar_opens(mm)
        )


def _map(path: Path) -> mmap.mmap | None:
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        if size == 0:
            return None
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)


def walk_bytes(label: str, data: bytes, depth: int) -> Iterator[Stream | Problem]:
    """The pickle streams in bytes that a pickle hands to ``torch.load`` (nested loads)."""
    yield from _walk_bytes(label, data, None, depth, NESTED)


def _from_byte_0(label: str, data: bytes | mmap.mmap) -> Stream:
    return Stream(f"{label} (read as a pickle from byte 0)", data, FROM_BYTE_0)


def _walk_bytes(
    label: str,
    data: bytes | mmap.mmap,
    path: Path | None,
    depth: int,
    role: str,
    torchscript: bool = False,
) -> Iterator[Stream | Problem]:
    head = bytes(data[:512])
    if depth > MAX_DEPTH:
        yield Problem(label, "error", f"archives nested deeper than {MAX_DEPTH} levels")
        return
    if role == PICKLE:
        yield Stream(label, data, "pickle", torchscript=torchscript)
        return
    if role == NESTED:
        # torch.load(io.BytesIO(b)): no file, so no tar (``_should_read_directly``), and no
        # decompression: a zip when it starts like one, else pickles from byte 0
        if is_zip(head):
            yield from _walk_zip(label, data, None, depth)
        else:
            yield Stream(label, data, "pickle")
        return
    if head.startswith(b"7z\xbc\xaf\x27\x1c"):
        yield Problem(label, "error", "7z archive: its members cannot be scanned")
        return
    if is_zip(head):
        yield from _walk_zip(label, data, path, depth)
        return
    if role == MEMBER:
        yield from _walk_member_bytes(label, data, head, depth, torchscript)
        return
    # a file: every reading some loader makes of it (torch.load: a tar if tarfile accepts it;
    # joblib.load: a compressed stream); none: torch.load and pickle.load unpickle it from byte 0
    known = False
    if depth == 0 and path is not None and data_format(head, path) is not None:
        known = True
        yield from _onnx_external_data(label, head, path, data)
    inflate = _decompressor(head)
    if inflate is not None:
        kind, make = inflate
        try:
            inflated = _inflate(data, make)
        except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as exc:
            if not known:  # a safetensors header's length may open like zlib or lzma
                yield Problem(label, "error", f"{kind} stream cannot be read ({exc})")
                return
        else:  # joblib and friends unpickle what they decompress
            yield from _walk_bytes(f"{label}!{kind}", inflated, None, depth + 1, LOAD)
    tar = tar_opens(data)
    if tar:
        yield from _walk_tar(label, data, depth)
    npy = head.startswith(b"\x93NUMPY")
    if npy:
        yield from _walk_npy(label, data)
    if not (known or inflate or tar or npy):
        yield from _pickle_file(label, data, path, head, depth)
        return
    # read as something else, but a file: torch.load of its bytes in memory, or pickle.load, reads
    # the pickle from byte 0 (a polyglot: a valid header for one reader, opcodes for the other)
    yield _from_byte_0(label, data)


def _walk_member_bytes(
    label: str, data: bytes | mmap.mmap, head: bytes, depth: int, torchscript: bool
) -> Iterator[Stream | Problem]:
    """A member nobody unpickles by name: opened when it is an archive, a compressed stream, an
    .npy or a pickle."""
    inflate = _decompressor(head)
    if inflate is not None:
        kind, make = inflate
        try:
            inflated = _inflate(data, make)
        except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as exc:
            yield Problem(label, "error", f"{kind} stream cannot be read ({exc})")
            return
        yield from _walk_bytes(f"{label}!{kind}", inflated, None, depth + 1, LOAD)
    elif tar_opens(data):
        yield from _walk_tar(label, data, depth)
    elif head.startswith(b"\x93NUMPY"):
        yield from _walk_npy(label, data)
    elif looks_like_pickle(head):
        yield Stream(label, data, "pickle", torchscript=torchscript)


def _pickle_file(
    label: str, data: bytes | mmap.mmap, path: Path | None, head: bytes, depth: int
) -> Iterator[Stream | Problem]:
    # torch.load unpickles any file that is not a zip or a tar: a pickle may open with any opcode
    yield Stream(label, data, "pickle" if looks_like_pickle(head) else "maybe-pickle")
    if path is not None and has_zip_tail(bytes(data[-65557:])):
        # zipfile-based readers see an archive at the end, torch reads the bytes in front as a
        # pickle: refuse the file as ambiguous, and scan the archive too where it can be read
        yield Problem(
            label, "error", "a zip archive follows other data: loaders disagree on what it holds"
        )
        yield from _walk_zip(f"{label}(appended zip)", data, path, depth)


def tar_opens(data: bytes | mmap.mmap) -> bool:
    """Whether torch's legacy loader takes the tar path: ``tarfile.open(fileobj=f, mode="r:")``
    accepts the file (any checksum form tarfile accepts, a first name starting with NUL, ...).
    Anything else than a ``TarError`` fails torch.load outright: no tar, and no pickle either."""
    if len(data) < tarfile.BLOCKSIZE:
        return False
    fileobj = data if isinstance(data, mmap.mmap) else io.BytesIO(data)
    fileobj.seek(0)
    try:
        with tarfile.open(fileobj=fileobj, mode="r:"):
            return True
    except Exception:  # TarError, or whatever else tarfile raises on garbage
        return False
    finally:
        fileobj.seek(0)


def data_format(head: bytes, path: Path) -> Format | None:
    """The registered format whose data files hold no pickle that ``head`` starts (safetensors,
    its header validated; ONNX; an ExecuTorch program; …), if any."""
    return next((f for f in FORMATS if f.holds_no_pickle(head, path)), None)


def _onnx_external_data(
    label: str, head: bytes, path: Path, data: bytes | mmap.mmap
) -> Iterator[Problem]:
    """ONNX initializers name external files; a location outside the model's folder would make
    the runtime read (and a converter copy) any file on the machine. A file naming none holds
    no ``location`` key (protobuf keeps strings as they are): onnx (a second to import) is not
    needed to say so."""
    if not is_onnx(head) or data.find(b"location") < 0:
        return
    try:
        import onnx
        from onnx.external_data_helper import _get_all_tensors
    except ImportError:
        yield Problem(label, "error", "ONNX external data cannot be checked without the onnx extra")
        return
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # the protobuf parser raises its own DecodeError
        yield Problem(label, "error", f"ONNX model cannot be parsed ({exc})")
        return
    base = path.parent.resolve()
    for tensor in _get_all_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        where = next((e.value for e in tensor.external_data if e.key == "location"), "")
        if _escapes(base, where):
            yield Problem(
                label,
                "dangerous",
                f"initializer {tensor.name!r} reads external data from {where!r}, "
                "outside the model's folder",
            )


def _escapes(base: Path, location: str) -> bool:
    loc = location.replace("\\", "/")
    if not loc or loc.startswith("/") or re.match(r"^[A-Za-z]:", loc) or ".." in loc.split("/"):
        return True
    target = (base / loc).resolve()  # symlinks resolved
    # in huggingface_hub's cache every file of a snapshot links to its blob, one folder up:
    # a link there stays within the model's own files (hub.links_into_blobs)
    return not (target.is_relative_to(base) or links_into_blobs(base, target))


def _decompressor(head: bytes) -> tuple[str, Callable[[], object]] | None:
    """Compressed streams that loaders (gzip, joblib's zlib/bz2/xz/lzma) open transparently."""
    if head.startswith(b"\x1f\x8b"):
        return "gunzip", lambda: zlib.decompressobj(16 + zlib.MAX_WBITS)
    # a zlib header whose FDICT bit (0x20) is set needs a preset dictionary no loader passes
    # (zlib.decompress fails at once): text opening "x " ("x = 1") is that, read from byte 0
    if len(head) >= 2 and head[0] == 0x78 and (head[0] * 256 + head[1]) % 31 == 0:
        return None if head[1] & 0x20 else ("zlib", zlib.decompressobj)
    if head.startswith(b"BZh"):
        return "bunzip2", bz2.BZ2Decompressor
    if head.startswith(b"\xfd7zXZ\x00"):
        return "unxz", lambda: lzma.LZMADecompressor(lzma.FORMAT_XZ)
    if head.startswith(b"\x5d\x00\x00"):
        return "unlzma", lambda: lzma.LZMADecompressor(lzma.FORMAT_ALONE)
    if head.startswith(b"ZF0x"):  # joblib < 0.10: "ZF", the hex length padded to 19, zlib data
        return "joblib-zlib", lambda: _SkipHeader(zlib.decompressobj(), 21)
    return None


class _SkipHeader:
    """A decompressor over a stream that opens with a fixed-size header of its own."""

    def __init__(self, inner: Any, skip: int) -> None:
        self.inner, self.skip = inner, skip

    def decompress(self, data: bytes, max_length: int = 0) -> bytes:
        if self.skip:
            cut = min(self.skip, len(data))
            data, self.skip = data[cut:], self.skip - cut
        out: bytes = self.inner.decompress(data, max_length)
        return out


def _inflate(data: bytes | mmap.mmap, make: Callable[[], object]) -> bytes:
    """Decompress at most MAX_INFLATED bytes, feeding the input in chunks and taking the output
    in steps: a bomb stops early in bounded memory. Concatenated members (gzip) are followed as
    the loaders do."""
    out = bytearray()
    pos, total = 0, len(data)
    d: Any = make()
    pending = b""
    while True:
        more = getattr(d, "needs_input", True) is False  # bz2/lzma hold output back
        if not pending and not more:
            if pos >= total:
                break
            pending = bytes(data[pos : pos + _CHUNK])
            pos += len(pending)
        room = min(_STEP, MAX_INFLATED + 1 - len(out))
        out += d.decompress(pending, room)
        pending = getattr(d, "unconsumed_tail", b"") or b""
        if len(out) > MAX_INFLATED:
            raise ValueError(f"expands past {MAX_INFLATED >> 20} MiB (a decompression bomb?)")
        if len(out) > RATIO_FLOOR and len(out) > MAX_RATIO * (pos - len(pending)):
            raise ValueError(f"expands more than {MAX_RATIO}-fold (a decompression bomb?)")
        if getattr(d, "eof", False):
            rest = (getattr(d, "unused_data", b"") or b"") + pending
            pending = b""
            if rest.strip(b"\0"):
                d, pending = make(), rest  # another member follows
            elif pos >= total:
                break
    if not getattr(d, "eof", True):
        raise EOFError("compressed stream is truncated")
    return bytes(out)


def _zip_kind(archive: ZipArchive) -> tuple[bool, bool]:
    """(TorchScript, pt2) by the members each writes."""
    # by the folders right under the archive's root, as torch reads them: TorchScript code of a
    # transformers model lives in code/__torch__/transformers/models/…, which is no pt2 folder
    tops = {tuple(n.lower().split("/")[1:2]) for n in archive.names}
    torchscript = ("constants.pkl",) in tops or ("code",) in tops
    pt2 = ("archive_format",) in tops or ("models",) in tops
    return torchscript, pt2


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
        if not archive.members:
            yield Problem(label, "error", "zip archive has no members")
        for anomaly in archive.anomalies:
            # torch ignores CRCs, flag bits and local names; duplicated or escaping names and
            # data in front make readers disagree on what the archive holds: refuse, not guess
            if any(w in anomaly for w in ("more than once", "escapes", "precede", "disagree")):
                yield Problem(label, "error", f"ambiguous zip archive: {anomaly}")
        torchscript, pt2 = _zip_kind(archive)
        # raw bytes by the rules of the loader that reads this kind of archive: torch.export.load
        # ignores a data.pkl, so a pt2 takes its raw members from its payload configs only
        raw = _pt2_raw_payloads(archive) if pt2 else _referenced_storages(archive)
        for m in archive.members:
            if m.is_dir:
                continue
            yield from _walk_member(archive, m, f"{label}:{m.name}", depth, raw, torchscript, pt2)
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


_PICKLE_NAMES = (".pkl", ".pickle", ".debug_pkl")


def _walk_member(
    archive: ZipArchive,
    m: ZipMember,
    label: str,
    depth: int,
    raw: set[str],
    torchscript: bool,
    pt2: bool,
) -> Iterator[Stream | Problem]:
    lower = m.name.lower()
    if lower in raw:
        return  # storage bytes the loader reads as they are, never as a pickle
    if lower.endswith(".so") or archive.read(m, 4) == b"\x7fELF":
        # AOTInductor packages: loading dlopens this library and runs its code
        yield Problem(label, "needs-code", "native code: a shared library that runs when loaded")
        return
    if torchscript and "/code/" in lower and lower.endswith(".py"):
        yield from _code(archive, m, label, graph=False)
        return
    if pt2 and "/models/" in lower and lower.endswith(".json"):
        yield from _code(archive, m, label, graph=True)
        return
    role = MEMBER
    if lower.endswith(_PICKLE_NAMES):
        role = PICKLE
    elif pt2 and "/data/" in lower and not lower.endswith(".json"):
        role = LOAD  # torch.export.load hands these to torch.load (or pickle.loads)
    if m.size > MAX_INFLATED:
        if role != MEMBER:
            yield Problem(label, "error", "member larger than the scan limit")
        return
    try:
        body = archive.read(m) if role != MEMBER else archive.read(m, 512)
        if role == MEMBER and _interesting(body):
            body = archive.read(m)
        elif role == MEMBER:
            return
    except InputError as exc:
        yield Problem(label, "error", exc.message)
        return
    yield from _walk_bytes(label, body, None, depth + 1, role, torchscript)


def _code(archive: ZipArchive, m: ZipMember, label: str, graph: bool) -> Iterator[Problem]:
    """TorchScript source or a pt2's serialized graph, judged by ``scan/tscode``."""
    from ptconvert.scan.exported_graph import analyse_program
    from ptconvert.scan.tscode import analyse_code_bytes

    if m.size > MAX_INFLATED:
        yield Problem(label, "error", "code member larger than the scan limit")
        return
    try:
        body = archive.read(m)
    except InputError as exc:
        yield Problem(label, "error", exc.message)
        return
    for f in analyse_program(body) if graph else analyse_code_bytes(body):
        where = f"node {f.line}" if graph else f"line {f.line}"
        where += f", {f.name}" if f.name else ""
        what = "program graph" if graph else "TorchScript code"
        yield Problem(label, f.severity, f"{what} ({where}): {f.reason}")


_PROTO0_GLOBAL = re.compile(rb"^c[A-Za-z_][\w.]*\n[A-Za-z_][\w.]*\n")
_PROTO0_START = re.compile(rb"^[(}\]][(dltSIVFcpgqh.NK}\])]")


def looks_like_pickle(head: bytes) -> bool:
    """A strict sniff: a protocol 2+ header, or protocol 0/1 opcodes that parse as such."""
    if len(head) >= 2 and head[0] == 0x80 and head[1] <= 5:
        return True
    return bool(_PROTO0_GLOBAL.match(head) or _PROTO0_START.match(head))


def _interesting(head: bytes) -> bool:
    """Whether a member's first bytes open a pickle, an archive or a compressed stream."""
    return (
        looks_like_pickle(head)
        or is_zip(head)
        or head.startswith((b"\x93NUMPY", b"7z\xbc\xaf"))
        or _decompressor(head) is not None
        or is_tar(head)
        or tar_opens(head)
    )


def _referenced_storages(archive: ZipArchive) -> set[str]:
    """The ``<root>/data/<key>`` members (lower-cased) that data.pkl's persistent ids point at."""
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
            out.add(f"{root}data/{pid[2]}".lower())
    return out


def _pt2_raw_payloads(archive: ZipArchive) -> set[str]:
    """Weights and tensor constants a pt2 archive stores as raw bytes, by the configs torch reads
    (``formats.pt2.payloads``); a member any of them hands to torch.load or pickle.loads, and
    every other member under data/, goes through the torch.load treatment."""
    from ptconvert.formats.pt2 import payloads

    try:
        entries = payloads(archive)
    except InputError:
        return set()  # a config torch cannot read either: scan every data member
    raw = {p.member.lower() for p in entries if not p.pickled}
    return raw - {p.member.lower() for p in entries if p.pickled}


# Legacy tar checkpoints: torch reads these members by name, whatever they look like.
_TAR_ROLES = {"storages": "tar-storages", "tensors": "tar-tensors", "pickle": PICKLE}
# Files in a generic archive that someone would hand to torch.load, pickle.load or joblib.load.
_LOADED_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle", ".joblib", ".pt2", ".tar")


def _walk_tar(label: str, data: bytes | mmap.mmap, depth: int) -> Iterator[Stream | Problem]:
    fileobj = data if isinstance(data, mmap.mmap) else io.BytesIO(data)
    fileobj.seek(0)
    try:
        with tarfile.open(fileobj=fileobj, mode="r:") as tar:
            for member in tar.getmembers():
                if not (member.isfile() or member.islnk() or member.issym()):
                    continue
                member_label = f"{label}:{member.name}"
                if member.size > MAX_INFLATED:
                    yield Problem(member_label, "error", "member larger than the scan limit")
                    continue
                try:  # a link is read through to its target, as torch's tar.extractfile does
                    f = tar.extractfile(member)
                except KeyError:
                    continue  # a link to nothing: the loader fails before reading it
                body = f.read(MAX_INFLATED + 1) if f is not None else b""
                if len(body) > MAX_INFLATED:
                    yield Problem(member_label, "error", "member larger than the scan limit")
                    continue
                name = os.path.normpath(member.name)
                role = _TAR_ROLES.get(name)
                if role in ("tar-storages", "tar-tensors"):
                    # pickled records between raw binary fields
                    yield Stream(member_label, body, role)
                    continue
                if role is None:
                    role = LOAD if name.lower().endswith(_LOADED_SUFFIXES) else MEMBER
                yield from _walk_bytes(member_label, body, None, depth + 1, role)
    except tarfile.TarError as exc:
        yield Problem(label, "error", f"tar archive cannot be read ({exc})")


def _walk_npy(label: str, data: bytes | mmap.mmap) -> Iterator[Stream | Problem]:
    """numpy's own header parser decides, as np.load does, whether objects are pickled."""
    try:
        from numpy.lib import format as npformat
    except ImportError:
        yield Problem(label, "error", ".npy header cannot be read without numpy")
        return
    fp = io.BytesIO(bytes(data[: 1 << 20]))
    try:
        version = npformat.read_magic(fp)
        if version == (1, 0):
            header = npformat.read_array_header_1_0(fp, max_header_size=1 << 20)
        elif version in ((2, 0), (3, 0)):  # 3.0 differs only in a utf-8 header
            header = npformat.read_array_header_2_0(fp, max_header_size=1 << 20)
        else:
            raise ValueError(f"unknown .npy version {version}")
        dtype = header[2]
    except (ValueError, SyntaxError, KeyError, TypeError, IndexError, EOFError) as exc:
        yield Problem(label, "error", f".npy header cannot be read ({exc})")
        return
    if dtype.hasobject:  # object arrays are pickled after the header
        yield Stream(label, data, "pickle", fp.tell())
