"""Hook ``pt2_archive_writer``: ``torch.export.save`` writing each weight from where it lies.

torch 2.13's writer turns every tensor's storage into a ``bytes`` object before writing it
(``torch.export.pt2_archive._package._get_raw_tensor_bytes``); the patch hands the writer the
storage and its size instead (``write_record``'s storage form, what ``torch.save`` uses). The
records, their names and their order stay torch's own, byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ptconvert._compat.registry import TORCH_TESTED, Hook, declare, options

NAME = "pt2_archive_writer"
_NAMES = ("_get_raw_tensor_bytes", "_is_fake_tensor", "PT2ArchiveWriter")


class _InPlace:
    """A CPU tensor whose storage is written as it lies (kept alive until it is written)."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor


def module_present() -> bool:
    """Whether torch's archive writer module is there, told without importing torch."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    found = spec.submodule_search_locations if spec is not None else None
    return any((Path(p) / "export/pt2_archive/_package.py").is_file() for p in found or [])


def _package() -> Any:
    from torch.export.pt2_archive import _package

    return _package


def _probe() -> bool:
    package = _package()
    return all(hasattr(package, n) for n in _NAMES) and hasattr(
        package.PT2ArchiveWriter, "write_bytes"
    )


def _apply() -> Callable[[], None]:
    package = _package()
    raw_bytes = package._get_raw_tensor_bytes
    write_bytes = package.PT2ArchiveWriter.write_bytes

    def in_place(value: Any) -> Any:
        if (
            options(NAME) is None
            or package._is_fake_tensor(value)
            or value.device.type != "cpu"
            or not value.data_ptr()
        ):
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

    package._get_raw_tensor_bytes = in_place
    package.PT2ArchiveWriter.write_bytes = write

    def undo() -> None:
        package._get_raw_tensor_bytes = raw_bytes
        package.PT2ArchiveWriter.write_bytes = write_bytes

    return undo


declare(
    Hook(
        name=NAME,
        what="patches torch.export.pt2_archive._package._get_raw_tensor_bytes and "
        "PT2ArchiveWriter.write_bytes (weights written from their storage, no bytes copy)",
        package="torch",
        tested=TORCH_TESTED,
        probe=_probe,
        fallback="torch's own save (a bytes copy of each tensor while it is written)",
        apply=_apply,
    )
)


READER = "pt2_archive_reader"


def _probe_reader() -> bool:
    import inspect

    reader = getattr(_package(), "PT2ArchiveReader", None)
    return reader is not None and "self.archive_file = " in inspect.getsource(reader.__init__)


def _apply_reader() -> Callable[[], None]:
    """Each ``PT2ArchiveReader`` made by a thread inside the patch has its ``archive_file``
    (torch's record reader) passed through the caller's ``wrap(archive, reader)``."""
    reader = _package().PT2ArchiveReader
    original = reader.__init__

    def init(self: Any, archive: Any) -> None:
        original(self, archive)
        opts = options(READER)
        if opts is not None:
            self.archive_file = opts["wrap"](archive, self.archive_file)

    reader.__init__ = init

    def undo() -> None:
        reader.__init__ = original

    return undo


declare(
    Hook(
        name=READER,
        what="patches torch.export.pt2_archive._package.PT2ArchiveReader.__init__ (its "
        "archive_file wrapped: torch.export.load maps a .pt2's weights from the file)",
        package="torch",
        tested=TORCH_TESTED,
        probe=_probe_reader,
        fallback="torch's own load (every record read into memory: a copy of the weights)",
        apply=_apply_reader,
    )
)
