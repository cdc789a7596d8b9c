"""``torch.export.save`` writing each weight from where it lies, not from a copy of it.

torch 2.13's writer turns every tensor's storage into a ``bytes`` object before writing it
(``_package._get_raw_tensor_bytes``): a second copy of the largest tensor in memory while it is
written (a vocabulary's embedding: 206 MB at 204 M parameters; the conversion's peak), and a
copy of every byte of the weights in time. Within ``records_in_place`` the writer is handed the
storage and its size instead (``write_record``'s storage form, what ``torch.save`` uses);
the records, their names and their order are torch's own, byte for byte. A torch without those
internals saves as it always did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class _InPlace:
    """A CPU tensor whose storage is written as it lies (kept alive until it is written)."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor


def _writer() -> Any:
    """torch's archive writer module when it has what ``records_in_place`` replaces, else None."""
    try:
        from torch.export.pt2_archive import _package
    except ImportError:
        return None
    names = ("_get_raw_tensor_bytes", "_is_fake_tensor", "PT2ArchiveWriter")
    if not all(hasattr(_package, n) for n in names):
        return None
    return _package if hasattr(_package.PT2ArchiveWriter, "write_bytes") else None


@contextlib.contextmanager
def records_in_place() -> Iterator[None]:
    """While it lasts, ``torch.export.save`` writes the raw weight records of CPU tensors from
    their storage (others, fake or empty tensors as torch does)."""
    _package = _writer()
    if _package is None:
        yield
        return
    raw_bytes = _package._get_raw_tensor_bytes
    write_bytes = _package.PT2ArchiveWriter.write_bytes

    def in_place(value: Any) -> Any:
        if _package._is_fake_tensor(value) or value.device.type != "cpu" or not value.data_ptr():
            return raw_bytes(value)
        return _InPlace(value)

    def write(self: Any, name: str, data: Any) -> None:
        if not isinstance(data, _InPlace):
            return write_bytes(self, name, data)
        storage = data.tensor.untyped_storage()
        try:
            # the storage itself, as torch.save hands it (its data pointer is a deprecated form
            # that warns on every record)
            self.archive_file.write_record(name, storage, storage.nbytes())
        except TypeError:  # a writer without the storage form: the bytes, as torch writes them
            write_bytes(self, name, raw_bytes(data.tensor))

    _package._get_raw_tensor_bytes = in_place
    _package.PT2ArchiveWriter.write_bytes = write
    try:
        yield
    finally:
        _package._get_raw_tensor_bytes = raw_bytes
        _package.PT2ArchiveWriter.write_bytes = write_bytes
