"""``torch.export.save`` writing each weight from where it lies, not from a copy of it.

torch 2.13's writer turns every tensor's storage into a ``bytes`` object before writing it: a
second copy of the largest tensor in memory while it is written (a vocabulary's embedding:
206 MB at 204 M parameters; the conversion's peak), and a copy of every byte of the weights in
time. Within ``records_in_place`` the writer is handed the storage and its size instead; the
records, their names and their order are torch's own, byte for byte. The patch is the hook
``pt2_archive_writer`` (``ptconvert/_compat/pt2_archive.py``): a torch without those internals
saves as it always did.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from ptconvert import _compat
from ptconvert._compat.pt2_archive import NAME


def records_in_place() -> AbstractContextManager[Any]:
    """While it lasts, ``torch.export.save`` writes the raw weight records of CPU tensors from
    their storage (others, fake or empty tensors as torch does)."""
    return _compat.patched(NAME)
