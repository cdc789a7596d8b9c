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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ptconvert.archive import ZipArchive, open_zip
from ptconvert.errors import CorruptFileError, TruncatedFileError
from ptconvert.formats.base import FileInfo, Format, Probe, file_entry
from ptconvert.formats.torch_objects import (
    Opaque,
    TensorRef,
    UnsupportedTensor,
    flatten_tensors,
    global_name,
    interpret,
)
from ptconvert.scan.allowlist import classify
from ptconvert.scan.machine import Global, PickleRun, run_pickle

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_MAGIC_BYTES = b"\x8a\x0a" + LEGACY_MAGIC.to_bytes(10, "little")
TAR_MEMBERS = frozenset({"sys_info", "pickle", "tensors", "storages"})


@dataclass
class PickledCheckpoint:
    """The decoded structure of a checkpoint: its object tree and every pickle run."""

    layout: str
    tree: Any
    runs: list[PickleRun]
    archive: ZipArchive | None = None

    @property
    def tensors(self) -> dict[str, TensorRef | UnsupportedTensor]:
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
        return PickledCheckpoint(layout, interpret(run.root, prefix), [run], archive)
    if layout == "legacy":
        with _mapped(path) as mm:
            runs: list[PickleRun] = []
            pos = 0
            for what in ("magic number", "protocol version", "sys_info", "object", "storage keys"):
                runs.append(_check(run_pickle(mm, pos), path, f"legacy checkpoint {what}"))
                pos = runs[-1].end
        return PickledCheckpoint(layout, interpret(runs[3].root), runs)
    if layout == "tar":
        return _read_tar(path)
    with _mapped(path) as mm:
        run = _check(run_pickle(mm, 0), path, "pickle stream")
    return PickledCheckpoint(layout, interpret(run.root), [run])


def _read_tar(path: Path) -> PickledCheckpoint:
    """The oldest layout: tensors live in a binary table; the pickle refers to them by key."""
    with tarfile.open(path, "r:") as tar:
        members = {m.name: m for m in tar.getmembers()}

        def read(name: str) -> bytes:
            f = tar.extractfile(members[name])
            if f is None:
                raise CorruptFileError(f"legacy tar member {name!r} is not a file", path=path)
            return f.read()

        storages, runs = tar_storages(read("storages"), path)
        tensors, truns = tar_tensors(read("tensors"), storages, path)
        main = _check(run_pickle(read("pickle")), path, "legacy tar pickle")
    runs += [*truns, main]

    def resolve(node: Any) -> Any:
        if isinstance(node, Opaque) and node.cls.startswith("pid:"):
            return tensors.get(node.cls[4:], node)
        if isinstance(node, dict):
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return type(node)(resolve(v) for v in node)
        return node

    return PickledCheckpoint("tar", resolve(interpret(main.root)), runs)


def tar_storages(data: bytes, path: Path) -> tuple[dict[str, tuple[str, int]], list[PickleRun]]:
    from ptconvert.formats.torch_objects import STORAGE_DTYPES

    runs = [_check(run_pickle(data), path, "legacy tar storage count")]
    count, pos = runs[0].root, runs[0].end
    out: dict[str, tuple[str, int]] = {}
    for _ in range(int(count)):
        run = _check(run_pickle(data, pos), path, "legacy tar storage record")
        runs.append(run)
        key, _location, stype = run.root
        dtype, size = STORAGE_DTYPES.get((global_name(stype) or "").rsplit(".", 1)[-1], ("?", 1))
        (numel,) = struct.unpack("<q", data[run.end : run.end + 8])
        out[str(key)] = (dtype, numel)
        pos = run.end + 8 + numel * size
    return out, runs


def tar_tensors(
    data: bytes, storages: dict[str, tuple[str, int]], path: Path
) -> tuple[dict[str, TensorRef], list[PickleRun]]:
    from ptconvert.formats.torch_objects import StorageRef

    runs = [_check(run_pickle(data), path, "legacy tar tensor count")]
    pos = runs[0].end
    out: dict[str, TensorRef] = {}
    for _ in range(int(runs[0].root)):
        run = _check(run_pickle(data, pos), path, "legacy tar tensor record")
        runs.append(run)
        key, storage_id, _ttype = run.root
        pos = run.end
        (ndim,) = struct.unpack("<i", data[pos : pos + 4])
        pos += 8
        shape = struct.unpack(f"<{ndim}q", data[pos : pos + 8 * ndim])
        stride = struct.unpack(f"<{ndim}q", data[pos + 8 * ndim : pos + 16 * ndim])
        (offset,) = struct.unpack("<q", data[pos + 16 * ndim : pos + 16 * ndim + 8])
        pos += 16 * ndim + 8
        dtype, numel = storages.get(str(storage_id), ("?", 0))
        storage = StorageRef(str(storage_id), dtype, numel, "cpu")
        out[str(key)] = TensorRef(storage, tuple(shape), tuple(stride), offset)
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
    if isinstance(value, dict):
        n = len(flatten_tensors(value))
        return f"dict of {len(value)} entries ({n} tensors)"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)}"
    if isinstance(value, Opaque):
        return f"object {value.cls}"
    return f"{type(value).__name__} {value!r}"[:80]


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


class CheckpointFormat(Format):
    name = "pt"
    suffixes = (".pt", ".pth", ".bin", ".ckpt", ".pkl")
    holds = "any pickled object: state dicts, training checkpoints, whole modules (needs code)"
    priority = 5

    def match(self, probe: Probe) -> str | None:
        head = probe.head
        if probe.zip is not None:
            return "zip" if probe.zip_has("data.pkl") else None
        if LEGACY_MAGIC_BYTES in head[:16]:
            return "legacy"
        if len(head) > 262 and head[257:262] == b"ustar":
            try:
                with tarfile.open(probe.path, "r:") as tar:
                    if set(tar.getnames()) >= TAR_MEMBERS:
                        return "tar"
            except tarfile.TarError:
                return None
        if head[:1] == b"\x80" and head[1:2] and head[1] <= 5:
            return "pickle"
        return None

    def info(self, path: Path, layout: str) -> FileInfo:
        ckpt = read_checkpoint(path, layout)
        info = FileInfo(str(path), self.name, layout, path.stat().st_size, [file_entry(path)])
        tensors = ckpt.tensors
        refs = {k: t for k, t in tensors.items() if isinstance(t, TensorRef)}
        info.add_tensors(
            ((k, t.dtype, list(t.shape), t.numel) for k, t in refs.items()), aliases(refs)
        )
        unsupported = {k: t.kind for k, t in tensors.items() if isinstance(t, UnsupportedTensor)}
        if unsupported:
            info.notes.append(f"{len(unsupported)} tensors are not plain strided: {unsupported}")
        info.contents = describe_contents(ckpt.tree)
        describe_pickles(info, ckpt.runs)
        if ckpt.archive is not None:
            _check_storages(info, ckpt, tensors)
        return info


def _check_storages(info: FileInfo, ckpt: PickledCheckpoint, tensors: dict[str, Any]) -> None:
    assert ckpt.archive is not None
    sizes = {m.name: m.size for m in ckpt.archive.members}
    for name, t in tensors.items():
        if isinstance(t, TensorRef):
            have = sizes.get(t.storage.key)
            if have is None:
                info.notes.append(f"tensor {name!r}: storage member {t.storage.key} is missing")
            elif have < t.storage.nbytes:
                info.notes.append(
                    f"tensor {name!r}: storage member {t.storage.key} holds {have} bytes, "
                    f"less than the {t.storage.nbytes} it should"
                )
