"""``pt``: torch pickle checkpoints (.pt/.pth/.bin/.ckpt) in every layout ``checkpoint.py``
reads — detected, described, their weights read (``checkpoint_weights.py``), read again
independently for the check (``checkpoint_reference.py``) and written (``torch_zip.py``)."""

from __future__ import annotations

import itertools
import tarfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ptconvert.archive import is_tar
from ptconvert.errors import UnsupportedConversionError
from ptconvert.formats.base import FileInfo, Format, Probe, file_entry
from ptconvert.formats.checkpoint import (
    TAR_MEMBERS,
    PickledCheckpoint,
    aliases,
    describe_contents,
    describe_pickles,
    read_checkpoint,
)
from ptconvert.formats.checkpoint_reference import pickle_reference
from ptconvert.formats.checkpoint_weights import read_checkpoint_weights
from ptconvert.formats.reference import Reference
from ptconvert.formats.torch_objects import TensorRef, Unmapped, UnsupportedTensor
from ptconvert.formats.torch_zip import write_torch_zip
from ptconvert.formats.weightset import WeightSet
from ptconvert.pickles.machine import run_pickle
from ptconvert.pickles.torch_streams import LEGACY_MAGIC

# first opcodes of a protocol 0/1 pickle (which has no PROTO opcode to recognise it by):
# MARK, EMPTY_DICT/LIST/TUPLE, GLOBAL, the text and binary ints and strings, NONE
_TEXT_PICKLE_OPENERS = frozenset(bytes([c]) for c in b"(}])cLIJKMNVXSUT")


def _legacy_magic(head: bytes) -> bool:
    """Whether the first pickle is torch's legacy magic number, as torch itself decides: run it
    and compare its value (the bytes differ with the protocol: ``L…L`` text, LONG1, a FRAME)."""
    run = run_pickle(head[:64])
    return run.error is None and type(run.root) is int and run.root == LEGACY_MAGIC


def _parses(probe: Probe) -> bool:
    """Whether the file opens with a pickle, which torch.load would unpickle (as the legacy magic
    number) whatever follows it: its first pickle runs to STOP within the head, or, for a longer
    file ending with STOP (one big pickle), runs without error until the head's bytes end."""
    run = run_pickle(probe.head)
    if run.error is None:
        return True
    return run.truncated and probe.size > len(probe.head) and probe.tail.endswith(b".")


class PtFormat(Format):
    name = "pt"
    may_hold_module = True
    suffixes = (".pt", ".pth", ".bin", ".ckpt", ".pkl")
    holds = "any pickled object: state dicts, training checkpoints, whole modules (needs code)"
    priority = 5

    def match(self, probe: Probe) -> str | None:
        head = probe.head
        if probe.zip is not None:
            return "zip" if probe.zip_has("data.pkl") else None
        if len(head) >= 512 and is_tar(head):  # torch tries tar first (any tar format)
            try:
                with tarfile.open(probe.path, "r:") as tar:
                    if set(tar.getnames()) >= TAR_MEMBERS:
                        return "tar"
            except tarfile.TarError:
                pass
        if _legacy_magic(head):
            return "legacy"
        if head[:1] == b"\x80" and head[1:2] and head[1] <= 5:
            return "pickle"
        if head[:1] in _TEXT_PICKLE_OPENERS and _parses(probe):
            return "pickle"  # protocol 0 or 1: no PROTO opcode
        return None

    read_label = "read tensors (opcode-level, no unpickling)"
    write_label = "write a torch zip checkpoint"
    folder_file = "pytorch_model.bin"
    reference_without_torch = True  # pickle records: no tensor built

    def read_weights(
        self, path: Path, layout: str, key: str | None, skip_unsupported: bool
    ) -> WeightSet:
        return read_checkpoint_weights(path, layout, key, skip_unsupported)

    def reference(self, ws: WeightSet, may_load: Callable[[], bool], stack: ExitStack) -> Reference:
        assert ws.origin is not None
        return pickle_reference(ws, [ws.origin])

    def write_weights(
        self,
        ws: WeightSet,
        out: Path,
        *,
        max_shard_size: int | None = None,
        metadata: dict[str, str] | None = None,
    ) -> list[Path]:
        if max_shard_size is not None:
            raise UnsupportedConversionError(
                "--max-shard-size writes safetensors shards only", path=ws.origin
            )
        return write_torch_zip(ws, out)

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
            info.notes.append(
                f"{len(unsupported)} tensors are not plain strided: {_first(unsupported)}"
            )
        unmapped = {
            k: f"{t.construct}: {t.reason}" for k, t in tensors.items() if isinstance(t, Unmapped)
        }
        if unmapped:
            what = f"{len(unmapped)} entries hold tensor data ptconvert cannot name"
            info.notes.append(f"{what}: {_first(unmapped)}")
        if not tensors:
            info.notes.append("the file holds no tensors")
        info.contents = describe_contents(ckpt.tree)
        describe_pickles(info, ckpt.runs)
        if ckpt.archive is not None:
            _check_storages(info, ckpt, tensors)
        return info


def _first(entries: dict[str, str], n: int = 20) -> str:
    """The first ``n`` entries of a note: a pickle that shares values can make a million."""
    if len(entries) <= n:
        return str(entries)
    return f"{dict(itertools.islice(entries.items(), n))} and {len(entries) - n:,} more"


def _check_storages(info: FileInfo, ckpt: PickledCheckpoint, tensors: dict[str, Any]) -> None:
    archive = ckpt.archive
    assert archive is not None
    for name, t in tensors.items():
        if isinstance(t, TensorRef):
            member = archive.member(t.storage.key)
            if member is None:
                info.notes.append(f"tensor {name!r}: storage member {t.storage.key} is missing")
            elif member.size < t.storage.nbytes:
                info.notes.append(
                    f"tensor {name!r}: storage member {t.storage.key} holds {member.size} bytes, "
                    f"less than the {t.storage.nbytes} it should"
                )
            elif why := archive.ratio_problem(member, t.storage.nbytes):
                info.notes.append(f"tensor {name!r}: {why}: convert refuses it")
