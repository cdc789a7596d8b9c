"""torch pickle checkpoints (.pt/.pth/.bin/.ckpt) in all their layouts.

- ``zip``: torch.save since 1.6, ``<root>/data.pkl`` plus a member per storage (``<root>/data/``);
- ``legacy``: torch.save before 1.6, a magic-number pickle, protocol, sys_info, the object and
  the storage keys, then the raw storages;
- ``tar``: the oldest torch.save, a tar of ``sys_info``, ``pickle``, ``tensors`` and ``storages``;
- ``pickle``: a raw pickle stream (a whole pickled module or dict written with ``pickle.dump``).

Everything here reads pickles with the symbolic machine: nothing is unpickled.
"""

from __future__ import annotations

import mmap
import struct
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert.archive import ZipArchive, open_zip
from ptconvert.errors import CorruptFileError, TruncatedFileError
from ptconvert.formats.base import FileInfo
from ptconvert.formats.torch_objects import (
    DTYPE_SIZES,
    STORAGE_DTYPES,
    Opaque,
    StorageRef,
    TensorRef,
    Unmapped,
    UnsupportedTensor,
    flatten_tensors,
    global_name,
    interpret,
)
from ptconvert.pickles.allowlist import classify
from ptconvert.pickles.machine import run_pickle
from ptconvert.pickles.records import Global, PickleRun, brief
from ptconvert.pickles.torch_streams import LEGACY_MAGIC

# the members torch's legacy loader reads, by name (in any order; sys_info it never reads)
TAR_MEMBERS = frozenset({"pickle", "tensors", "storages"})


@dataclass
class PickledCheckpoint:
    """The decoded structure of a checkpoint: its object tree and every pickle run."""

    layout: str
    tree: Any
    runs: list[PickleRun]
    archive: ZipArchive | None = None
    # legacy and tar layouts: storage key → (file offset of its first byte, its size in bytes)
    storages: dict[str, tuple[int, int]] = field(default_factory=dict)
    byteorder: str = "little"  # of the storage bytes (a zip's ``byteorder`` record)

    @property
    def tensors(self) -> dict[str, TensorRef | UnsupportedTensor | Unmapped]:
        return flatten_tensors(self.tree)

    @property
    def imports(self) -> list[Global]:
        return [g for r in self.runs for g in r.imports]


def _check(run: PickleRun, path: Path, what: str) -> PickleRun:
    if run.error:
        cls = TruncatedFileError if run.truncated else CorruptFileError
        raise cls(f"{what} cannot be parsed at byte {run.end}: {run.error}", path=path)
    return run


@contextmanager
def _mapped(path: Path) -> Iterator[mmap.mmap]:
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        yield mm


def read_checkpoint(path: Path, layout: str) -> PickledCheckpoint:
    """Decode a checkpoint's pickles symbolically (no code runs) for any layout."""
    if layout == "zip":
        archive = open_zip(path)
        root = archive.root()
        member = archive.member(root + "data.pkl")
        if member is None:
            raise CorruptFileError("torch zip checkpoint has no data.pkl member", path=path)
        run = _check(run_pickle(archive.read(member)), path, f"{member.name}")
        prefix = root + "data/"
        order = archive.member(root + "byteorder")
        byteorder = archive.read(order).decode("ascii", "replace").strip() if order else "little"
        if byteorder not in ("little", "big"):
            raise CorruptFileError(f"unknown byteorder record {byteorder!r:.40}", path=path)
        tree = interpret(run.root, prefix)
        return PickledCheckpoint(layout, tree, [run], archive, byteorder=byteorder)
    if layout == "legacy":
        return _read_legacy(path)
    if layout == "tar":
        return _read_tar(path)
    with _mapped(path) as mm:  # a joblib.dump has raw array bytes after each array wrapper
        run = _check(run_pickle(mm, 0, joblib=True), path, "pickle stream")
    return PickledCheckpoint(layout, interpret(run.root), [run])


_LEGACY_PICKLES = ("magic number", "protocol version", "sys_info", "object", "storage keys")


def _read_legacy(path: Path) -> PickledCheckpoint:
    """torch.save before 1.6: five pickles, then each storage as an 8-byte little-endian element
    count and its bytes, in the order of the storage keys (always little-endian, as torch writes
    and reads them whatever the machine)."""
    with _mapped(path) as mm:
        runs: list[PickleRun] = []
        pos = 0
        for what in _LEGACY_PICKLES:
            runs.append(_check(run_pickle(mm, pos), path, f"legacy checkpoint {what}"))
            pos = runs[-1].end
        if runs[0].root != LEGACY_MAGIC:
            raise CorruptFileError("legacy checkpoint without its magic number", path=path)
        keys = runs[4].root
        if not isinstance(keys, list) or not all(isinstance(k, (str, bytes, int)) for k in keys):
            raise CorruptFileError("legacy checkpoint storage keys are not a list", path=path)
        itemsizes = _storage_itemsizes(runs[3])
        storages: dict[str, tuple[int, int]] = {}
        if any(e.kind == "persid" and e.opcode == "PERSID" for e in runs[3].events):
            keys = []  # protocol 0: text persistent ids; the tree names them as unreadable
        for raw in keys:
            key = _text(raw)
            if key not in itemsizes:
                raise CorruptFileError(f"storage {key} is listed but never referenced", path=path)
            if pos + 8 > len(mm):
                raise TruncatedFileError(f"legacy storage {key} is cut off", path=path)
            (numel,) = struct.unpack("<q", mm[pos : pos + 8])
            nbytes = numel * itemsizes[key]
            if numel < 0 or pos + 8 + nbytes > len(mm):
                raise TruncatedFileError(
                    f"legacy storage {key} needs {nbytes} bytes from byte {pos + 8}, "
                    f"past the end of the file ({len(mm)} bytes)",
                    path=path,
                )
            storages[key] = (pos + 8, nbytes)
            pos += 8 + nbytes
    return PickledCheckpoint("legacy", interpret(runs[3].root), runs, storages=storages)


def _storage_itemsizes(run: PickleRun) -> dict[str, int]:
    """Bytes per element of each storage, by key: the first reference decides, as in torch."""
    out: dict[str, int] = {}
    for event in run.events:
        pid = getattr(event.target, "pid", None) if event.kind == "persid" else None
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] in ("storage", b"storage"):
            cls = (global_name(pid[1]) or "").rsplit(".", 1)[-1]
            if cls in STORAGE_DTYPES:
                out.setdefault(_text(pid[2]), STORAGE_DTYPES[cls][1])
    return out


def _text(value: Any) -> str:
    if isinstance(value, (str, bytes)):
        return value.decode("latin-1") if isinstance(value, bytes) else value
    return brief(value, None)  # str() of a pickled value may never end


def _read_tar(path: Path) -> PickledCheckpoint:
    """The oldest layout: tensors live in a binary table; the pickle refers to them by key."""
    try:
        tar = tarfile.open(path, "r:")  # noqa: SIM115 (closed by the ``with`` below)
    except tarfile.TarError as exc:
        raise CorruptFileError(f"legacy tar checkpoint cannot be read ({exc})", path=path) from None
    with tar:
        members = {m.name: m for m in tar.getmembers()}
        missing = sorted(TAR_MEMBERS - set(members))
        if missing:
            raise CorruptFileError(f"legacy tar checkpoint lacks {missing}", path=path)

        def read(name: str) -> bytes:
            f = tar.extractfile(members[name])
            if f is None:
                raise CorruptFileError(f"legacy tar member {name!r} is not a file", path=path)
            return f.read()

        records, sruns = _tar_storage_records(read("storages"), path)
        types = {key: (dtype, numel) for key, (dtype, numel, _, _) in records.items()}
        tensors, truns = tar_tensors(read("tensors"), types, path)
        main = _check(run_pickle(read("pickle")), path, "legacy tar pickle")
        base = members["storages"].offset_data
    storages = {
        key: (base + pos, numel * DTYPE_SIZES.get(dtype, 1))
        for key, (dtype, numel, pos, _) in records.items()
    }

    def resolve(pid: Any) -> Any:
        if isinstance(pid, tuple):  # ('module', class, file, source) of a whole-module pickle
            return Opaque(f"module {global_name(pid[1]) if len(pid) > 1 else '?'}")
        t = tensors.get(_text(pid))
        if t is None:
            return Unmapped("legacy tar reference", f"no tensor has the key {brief(pid, 40)}")
        if t.dtype not in DTYPE_SIZES:
            return Unmapped("legacy tar tensor", "its storage has an unknown type")
        return t

    tree = interpret(main.root, persistent=resolve)
    return PickledCheckpoint("tar", tree, [*sruns, *truns, main], storages=storages)


def _unpack(fmt: str, data: bytes, pos: int, path: Path, what: str) -> tuple[Any, ...]:
    try:
        return struct.unpack_from(fmt, data, pos)
    except struct.error:
        raise TruncatedFileError(f"legacy tar {what} is cut off at byte {pos}", path=path) from None


def _tar_storage_records(
    data: bytes, path: Path
) -> tuple[dict[str, tuple[str, int, int, str]], list[PickleRun]]:
    """key → (dtype, element count, offset of its bytes in the member, root key); a storage view
    (the table after the storages) gets the byte range of its part of the root."""
    runs = [_check(run_pickle(data), path, "legacy tar storage count")]
    count, pos = runs[0].root, runs[0].end
    if not isinstance(count, int) or count < 0:
        raise CorruptFileError(f"legacy tar storage count is {brief(count, 40)}", path=path)
    out: dict[str, tuple[str, int, int, str]] = {}
    for _ in range(count):
        run = _check(run_pickle(data, pos), path, "legacy tar storage record")
        runs.append(run)
        if not (isinstance(run.root, tuple) and len(run.root) == 3):
            raise CorruptFileError(
                "legacy tar storage record is not (key, location, type)", path=path
            )
        key, _location, stype = run.root
        dtype, size = STORAGE_DTYPES.get((global_name(stype) or "").rsplit(".", 1)[-1], ("?", 1))
        (numel,) = _unpack("<q", data, run.end, path, "storage size")
        if numel < 0 or run.end + 8 + numel * size > len(data):
            raise TruncatedFileError(f"legacy tar storage {key} is cut off", path=path)
        out[_text(key)] = (dtype, numel, run.end + 8, _text(key))
        pos = run.end + 8 + numel * size
    if pos < len(data):  # storage views: (view key, root key, offset, element count)
        run = _check(run_pickle(data, pos), path, "legacy tar storage views")
        runs.append(run)
        for view in run.root if isinstance(run.root, list) else ():
            if not (isinstance(view, tuple) and len(view) == 4 and _text(view[1]) in out):
                raise CorruptFileError(f"legacy tar storage view {brief(view, 60)}", path=path)
            dtype, _, start, root = out[_text(view[1])]
            offset, numel = int(view[2]), int(view[3])
            out[_text(view[0])] = (dtype, numel, start + offset * DTYPE_SIZES.get(dtype, 1), root)
    return out, runs


def tar_storages(data: bytes, path: Path) -> tuple[dict[str, tuple[str, int]], list[PickleRun]]:
    """The storages member of a legacy tar: key → (dtype, element count), and its pickle runs."""
    records, runs = _tar_storage_records(data, path)
    return {key: (dtype, numel) for key, (dtype, numel, _, _) in records.items()}, runs


def tar_tensors(
    data: bytes, storages: dict[str, tuple[str, int]], path: Path
) -> tuple[dict[str, TensorRef], list[PickleRun]]:
    """The tensors member of a legacy tar: key → tensor view of a storage, and its pickle runs."""
    runs = [_check(run_pickle(data), path, "legacy tar tensor count")]
    pos = runs[0].end
    count = runs[0].root
    if not isinstance(count, int) or count < 0:
        raise CorruptFileError(f"legacy tar tensor count is {brief(count, 40)}", path=path)
    out: dict[str, TensorRef] = {}
    for _ in range(count):
        run = _check(run_pickle(data, pos), path, "legacy tar tensor record")
        runs.append(run)
        if not (isinstance(run.root, tuple) and len(run.root) == 3):
            raise CorruptFileError(
                "legacy tar tensor record is not (key, storage, type)", path=path
            )
        key, storage_id, _ttype = run.root
        pos = run.end
        (ndim,) = _unpack("<i", data, pos, path, "tensor record")
        if not 0 <= ndim <= 64:
            raise CorruptFileError(f"legacy tar tensor {key} has {ndim} dimensions", path=path)
        pos += 8  # the dimension count was once 8 bytes wide: torch skips the other 4
        shape = _unpack(f"<{ndim}q", data, pos, path, "tensor record")
        stride = _unpack(f"<{ndim}q", data, pos + 8 * ndim, path, "tensor record")
        (offset,) = _unpack("<q", data, pos + 16 * ndim, path, "tensor record")
        pos += 16 * ndim + 8
        dtype, numel = storages.get(_text(storage_id), ("?", 0))
        storage = StorageRef(_text(storage_id), dtype, numel, "cpu")
        out[_text(key)] = TensorRef(storage, tuple(shape), tuple(stride), offset)
    return out, runs


def aliases(tensors: dict[str, TensorRef]) -> frozenset[str]:
    """Names whose tensor is the same view of the same storage as an earlier name (tied)."""
    seen: set[tuple[object, ...]] = set()
    out = set()
    for name, t in tensors.items():
        key = (t.storage.key, t.offset, t.shape, t.stride)
        if key in seen:
            out.add(name)
        seen.add(key)
    return frozenset(out)


def describe_contents(tree: Any) -> dict[str, str]:
    """One line per top-level entry of a checkpoint dict (what else the file holds)."""
    if not isinstance(tree, dict):
        return {"<root>": _kind(tree)}
    return {str(k): _kind(v) for k, v in tree.items()}


def _kind(value: Any) -> str:
    if isinstance(value, TensorRef):
        return f"tensor {value.dtype}{list(value.shape)}"
    if isinstance(value, UnsupportedTensor):
        return f"{value.kind} tensor"
    if isinstance(value, Unmapped):
        return f"tensor data in {value.construct} ({value.reason})"[:120]
    if isinstance(value, dict):
        n = len(flatten_tensors(value))
        return f"dict of {len(value)} entries ({n} tensors)"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)}"
    if isinstance(value, Opaque):
        return f"object {value.cls}"
    return f"{type(value).__name__} {brief(value)}"[:80]


def describe_pickles(info: FileInfo, runs: list[PickleRun]) -> None:
    """Fill ``globals`` and ``needs_code`` from the imports every pickle makes."""
    names = sorted({g.dotted for r in runs for g in r.imports})
    info.globals = names
    info.needs_code = [
        g.dotted
        for g in {g.dotted: g for r in runs for g in r.imports}.values()
        if classify(g.module or "?", g.name or "?") != "safe"
    ]
    info.needs_code.sort()
