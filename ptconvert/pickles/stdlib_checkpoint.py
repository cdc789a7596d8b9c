"""Torch pickle checkpoints read with the standard library only, for the bitwise check.

The pickles go through ``RecordUnpickler`` (nothing they name is imported or called); the
storages' bytes are slices of one read-only map of the file, never copied (a compressed zip
member is inflated by ``zipfile``). The layouts, as ``torch.load`` reads them
(``torch/serialization.py``):

- zip: ``<root>/data.pkl``, one ``<root>/data/<key>`` member per storage and ``<root>/byteorder``
  ("little" when absent), ``<root>`` being the folder of the first member;
- legacy (torch.save before 1.6): five pickles (magic number, protocol, sys_info, the object,
  the storage keys), then per key an int64 element count and the storage's bytes;
- tar (older still): members ``storages`` (a count; per storage (key, location, type), an int64
  element count and its bytes; then the views), ``tensors`` (a count; per tensor (key, storage
  key, type), ndim, sizes, strides and offset) and ``pickle``, whose persistent ids are tensor
  keys. Member order does not matter.

This reader shares no code with ptconvert's own (``pickles/machine.py``, ``archive.py``).
"""

from __future__ import annotations

import mmap
import struct
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ptconvert.pickles.stdlib_unpickler import (
    ITEMSIZES,
    RecordUnpickler,
    Storage,
    StorageType,
    Tensor,
    brief,
    rebuild_tensor,
    storage_id,
)

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C  # torch.serialization's, first pickle of the legacy layout
PROTOCOL_VERSION = 1001
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature … file name length, extra field length


@dataclass
class PickleFile:
    """A checkpoint's object tree (``Tensor`` records where torch has tensors) and its bytes."""

    tree: Any
    reader: str  # what read it, for the report
    big_endian: bool = False  # storages hold their elements big-endian (a zip's byteorder)
    roots: dict[str, memoryview] = field(default_factory=dict)  # stored bytes by storage key
    # where a root's bytes lie in the file as they are (not a compressed member's), by key
    offsets: dict[str, int] = field(default_factory=dict)

    def storage_bytes(self, storage: Storage) -> memoryview:
        """The storage's bytes; ValueError when the file holds fewer."""
        root = self.roots.get(storage.key)
        if root is None:
            raise ValueError(f"storage {storage.key} is not in the file")
        if storage.offset + storage.nbytes > len(root):
            raise ValueError(
                f"storage {storage.key} holds {len(root)} bytes, the pickle names "
                f"{storage.nbytes} from byte {storage.offset}"
            )
        return root[storage.offset : storage.offset + storage.nbytes]

    def file_offset(self, storage: Storage) -> int | None:
        """Where the storage's bytes begin in the file, when the file holds them as they are."""
        at = self.offsets.get(storage.key)
        return None if at is None else at + storage.offset

    def problem(self, t: Tensor) -> str | None:
        """Why the tensor's bytes cannot be given as torch.load gives them, if they cannot."""
        try:
            data = self.storage_bytes(t.storage)
        except ValueError as exc:
            return str(exc)
        if t.extent * t.itemsize > len(data):
            return (
                f"its view (offset {t.offset}, shape {list(t.shape)}, stride {list(t.stride)}) "
                f"reaches past the {len(data)} bytes of storage {t.storage.key}"
            )
        if self.big_endian and ITEMSIZES[t.storage.dtype] < t.itemsize:
            return f"{t.dtype} stored big-endian in an untyped storage, which torch does not swap"
        return None


def read_pickle_file(path: Path) -> PickleFile:
    """The checkpoint at ``path`` as records; ValueError (or the unpickler's own error) when it
    is not a torch pickle checkpoint this reader can read."""
    with open(path, "rb") as fh:
        # one read-only map of the whole file: storages are slices of it, paged in when compared
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        whole = memoryview(mm)
        if whole[:4] == b"PK\x03\x04":  # as torch.load tells a zip: a local header first
            return _read_zip(path, whole)
        try:
            tar = tarfile.open(path, "r:")  # noqa: SIM115 (closed below)
        except tarfile.TarError:
            return _read_legacy(fh, whole)
        with tar:
            return _read_tar(tar, fh, whole)


def _read_zip(path: Path, whole: memoryview) -> PickleFile:
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        if not infos or "/" not in names[0]:
            raise ValueError("the zip's first member is not in a folder, as torch needs")
        if len(set(names)) != len(names):
            raise ValueError("the zip has two members of one name")
        root = names[0].split("/", 1)[0] + "/"
        by_name = {i.filename: i for i in infos}
        if root + "data.pkl" not in by_name:
            raise ValueError(f"the zip has no {root}data.pkl")
        order = zf.read(by_name[root + "byteorder"]) if root + "byteorder" in by_name else b"little"
        if order not in (b"little", b"big"):
            raise ValueError(f"unknown byteorder {order!r:.20}")
        storages: dict[str, Storage] = {}

        def persistent_load(saved_id: Any) -> Storage:
            found = storage_id(saved_id)
            if found is None or found[3] is not None:
                raise ValueError(f"not a storage id: {brief(saved_id, 80)}")
            stype, key, numel, _ = found
            # torch.load keeps the first storage of a key (and its dtype)
            return storages.setdefault(key, Storage(key, stype.dtype, numel))

        with zf.open(by_name[root + "data.pkl"]) as pkl:
            tree = RecordUnpickler(pkl, persistent_load).load()
        roots: dict[str, memoryview] = {}
        offsets: dict[str, int] = {}
        for key, storage in storages.items():
            info = by_name.get(f"{root}data/{key}")
            if info is None:
                raise ValueError(f"storage {key} has no member {root}data/{key}")
            data, at = _member(zf, info, whole)
            if len(data) < storage.nbytes:
                raise ValueError(f"storage {key} holds {len(data)} bytes, not {storage.nbytes}")
            roots[key] = data[: storage.nbytes]
            if at is not None:
                offsets[key] = at
    return PickleFile(tree, "stdlib pickle + zipfile", order == b"big", roots, offsets)


def _member(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo, whole: memoryview
) -> tuple[memoryview, int | None]:
    """A stored member as a slice of the map (found through its local header) and where it
    begins; any other inflated by zipfile (and no place in the file)."""
    if info.flag_bits & 1:
        raise ValueError(f"{info.filename} is encrypted")
    if info.compress_type != zipfile.ZIP_STORED:
        return memoryview(zf.read(info)), None
    at = info.header_offset
    head = bytes(whole[at : at + _LOCAL_HEADER.size])
    if len(head) < _LOCAL_HEADER.size or head[:4] != b"PK\x03\x04":
        raise ValueError(f"{info.filename} has no local header at byte {at}")
    _, name_len, extra_len = _LOCAL_HEADER.unpack(head)
    start = at + _LOCAL_HEADER.size + name_len + extra_len
    if start + info.file_size > len(whole) or info.compress_size != info.file_size:
        raise ValueError(f"{info.filename} is cut off")
    return whole[start : start + info.file_size], start


def _load(fh: IO[bytes], persistent_load: Callable[[Any], Any] | None = None) -> Any:
    return RecordUnpickler(fh, persistent_load).load()


def _read_legacy(fh: IO[bytes], whole: memoryview) -> PickleFile:
    fh.seek(0)
    if _load(fh) != MAGIC_NUMBER:
        raise ValueError("neither a zip, a tar nor a legacy torch pickle (no magic number)")
    if _load(fh) != PROTOCOL_VERSION:
        raise ValueError("unknown legacy protocol version")
    _load(fh)  # sys_info
    roots: dict[str, Storage] = {}
    views: dict[str, Storage] = {}

    def persistent_load(saved_id: Any) -> Any:
        found = storage_id(saved_id)
        if found is None:
            if isinstance(saved_id, tuple) and saved_id[:1] in (("module",), (b"module",)):
                return saved_id[1] if len(saved_id) > 1 else None  # a module's class
            raise ValueError(f"not a storage id: {brief(saved_id, 80)}")
        stype, key, numel, view = found
        root = roots.setdefault(key, Storage(key, stype.dtype, numel))
        if view is None:
            return root
        try:
            view_key, offset, view_numel = view
        except (TypeError, ValueError):
            raise ValueError(f"storage view {brief(view, 60)}") from None
        at = _count(offset) * ITEMSIZES[root.dtype]
        return views.setdefault(str(view_key), Storage(key, root.dtype, _count(view_numel), at))

    tree = _load(fh, persistent_load)
    keys = _load(fh)
    if not isinstance(keys, list):
        raise ValueError("the storage keys are not a list")
    pos = fh.tell()
    data: dict[str, memoryview] = {}
    offsets: dict[str, int] = {}
    for key in map(str, keys):
        if key not in roots:
            raise ValueError(f"storage {key} is listed but no tensor uses it")
        offsets[key] = pos + 8
        pos, count, data[key] = _counted(whole, pos, key, ITEMSIZES[roots[key].dtype])
        if count != roots[key].numel:  # torch: "storage has wrong byte size"
            raise ValueError(f"storage {key} holds {count} elements, not {roots[key].numel}")
    return PickleFile(tree, "stdlib pickle", roots=data, offsets=offsets)


def _counted(whole: memoryview, pos: int, key: str, itemsize: int) -> tuple[int, int, memoryview]:
    """A storage written as an int64 element count and its bytes: (end, count, its bytes)."""
    head = bytes(whole[pos : pos + 8])
    count = struct.unpack("<q", head)[0] if len(head) == 8 else -1
    end = pos + 8 + count * itemsize
    if count < 0 or end > len(whole):
        raise ValueError(f"storage {key} is cut off")
    return end, count, whole[pos + 8 : end]


def _read_tar(tar: tarfile.TarFile, fh: IO[bytes], whole: memoryview) -> PickleFile:
    members = {m.name: m for m in tar.getmembers()}  # the last of a name, as tar.extract
    spans: dict[str, tuple[int, int]] = {}
    for name in ("storages", "tensors", "pickle"):
        m = members.get(name)
        if m is None or not m.isfile() or m.offset_data + m.size > len(whole):
            raise ValueError(f"the legacy tar has no {name} member")
        spans[name] = (m.offset_data, m.offset_data + m.size)
    objects: dict[Any, Any] = {}
    data: dict[str, memoryview] = {}
    offsets: dict[str, int] = {}

    start, end = spans["storages"]
    fh.seek(start)
    for _ in range(_count(_load(fh))):
        record = _load(fh)
        if not isinstance(record, tuple) or len(record) != 3:
            raise ValueError(f"legacy tar storage record {brief(record, 60)}")
        key, _, stype = record
        if not isinstance(stype, StorageType):
            raise ValueError(f"legacy tar storage {brief(key, 40)} of type {brief(stype, 40)}")
        offsets[str(key)] = fh.tell() + 8
        pos, count, data[str(key)] = _counted(whole, fh.tell(), str(key), ITEMSIZES[stype.dtype])
        objects[key] = Storage(str(key), stype.dtype, count)
        fh.seek(pos)
    for target, root_key, offset, numel in _load(fh):
        root = objects[root_key]
        at = root.offset + _count(offset) * ITEMSIZES[root.dtype]
        objects[target] = Storage(root.key, root.dtype, _count(numel), at)
    if fh.tell() > end:
        raise ValueError("the legacy tar storages member is cut off")

    start, end = spans["tensors"]
    fh.seek(start)
    for _ in range(_count(_load(fh))):
        record = _load(fh)
        if not isinstance(record, tuple) or len(record) != 3:
            raise ValueError(f"legacy tar tensor record {brief(record, 60)}")
        key, storage_key, _ = record
        (ndim,) = struct.unpack("<i", _exact(fh, 8)[:4])  # then 4 unused bytes
        sizes = struct.unpack(f"<{ndim}q", _exact(fh, 8 * ndim))
        strides = struct.unpack(f"<{ndim}q", _exact(fh, 8 * ndim))
        (offset,) = struct.unpack("<q", _exact(fh, 8))
        objects[key] = rebuild_tensor(objects.get(storage_key), offset, sizes, strides)
    if fh.tell() > end:
        raise ValueError("the legacy tar tensors member is cut off")

    def persistent_load(saved_id: Any) -> Any:
        if isinstance(saved_id, tuple):
            return saved_id[0] if saved_id else None  # a module's class
        return objects[int(saved_id)]

    start, end = spans["pickle"]
    fh.seek(start)
    tree = _load(fh, persistent_load)
    if fh.tell() > end:
        raise ValueError("the legacy tar pickle member is cut off")
    return PickleFile(tree, "stdlib pickle + tarfile", roots=data, offsets=offsets)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"a count of {brief(value, 40)}")
    return value


def _exact(fh: IO[bytes], n: int) -> bytes:
    if n < 0:
        raise ValueError("a negative size")
    data = fh.read(n)
    if len(data) != n:
        raise ValueError("the file is cut off")
    return data
