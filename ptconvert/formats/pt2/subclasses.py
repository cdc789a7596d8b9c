"""A pt2 weight stored as a pickle, described without running it: the tensor subclass it
rebuilds (torchao's quantized weights are stored so: ``torchao.quantization.Int8Tensor``
holding an int8 ``qdata`` and float scales) and the bytes of its storages.

torch.export.load hands such a member to ``torch.load``: a torch.save zip whose first entry,
``data.pkl``, torch writes uncompressed. Its first bytes are enough: the symbolic pickle machine
runs them up to the STOP opcode and records the imports and storage references."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ptconvert.archive import ZipArchive, ZipMember
from ptconvert.errors import InputError
from ptconvert.formats.torch_objects import STORAGE_DTYPES, global_name
from ptconvert.pickles.machine import run_pickle
from ptconvert.pickles.records import Event, PersistentRef

_HEAD = 1 << 16  # a subclass's data.pkl is a few hundred bytes: a longer one is not described
# the torch.save classes a weight's pickle names that are no subclass of its own
_TORCH = ("torch.", "builtins.", "collections.")
# modules whose tensor subclasses are quantized weights (torchao's Int8Tensor, Int4Tensor,
# IntxUnpackedToInt8Tensor, Float8Tensor; its older AffineQuantizedTensor in torchao.dtypes)
_QUANTIZED_MODULES = ("torchao.quantization", "torchao.dtypes", "torchao.prototype.quantization")


@dataclass(frozen=True)
class PickledWeight:
    subclass: str | None  # the class it rebuilds (dotted), None if no class beyond torch's
    nbytes: int | None  # its storages' bytes, None when they cannot be told

    @property
    def quantized(self) -> bool:
        """Whether the class is one of torchao's quantized tensors (by its module)."""
        return self.subclass is not None and self.subclass.startswith(_QUANTIZED_MODULES)

    @property
    def label(self) -> str:
        """How ``info`` names its dtype: the library and the class (``torchao.Int8Tensor``)."""
        assert self.subclass is not None
        module, _, name = self.subclass.rpartition(".")
        return f"{module.split('.')[0]}.{name}"


def pickled_weight(archive: ZipArchive, member: ZipMember) -> PickledWeight | None:
    """What the torch.save archive in ``member`` rebuilds, None when its first entry is not an
    uncompressed ``data.pkl`` the machine reads to its end within the first bytes."""
    try:
        head = archive.read(member, _HEAD)
    except InputError:
        return None
    if len(head) < 30 or head[:4] != b"PK\x03\x04":
        return None
    (method,) = struct.unpack_from("<H", head, 8)  # the local header: compression method,
    name_len, extra_len = struct.unpack_from("<HH", head, 26)  # then the name's, extra's length
    name = head[30 : 30 + name_len]
    if method != 0 or not name.endswith(b"data.pkl"):
        return None
    run = run_pickle(head[30 + name_len + extra_len :])
    if run.error is not None:
        return None  # longer than the bytes read, or no pickle: not described
    classes = [g.dotted for g in run.imports if g.module and g.name]
    subclass = next((c for c in classes if not c.startswith(_TORCH)), None)
    return PickledWeight(subclass, _storage_bytes(run.events))


def _storage_bytes(events: list[Event]) -> int | None:
    """The bytes of the storages the pickle references, None if one is of no known class."""
    total = 0
    for e in events:
        if e.kind != "persid" or not isinstance(e.target, PersistentRef):
            continue
        ref = e.target.pid
        if not (isinstance(ref, tuple) and len(ref) >= 5 and ref[0] == "storage"):
            return None
        stype = (global_name(ref[1]) or "").rsplit(".", 1)[-1]
        if stype not in STORAGE_DTYPES or not isinstance(ref[4], int):
            return None
        total += ref[4] * STORAGE_DTYPES[stype][1]
    return total
