"""Sharded weight sets: ``*.safetensors.index.json`` or ``pytorch_model.bin.index.json``.

The index maps each tensor name to a shard file beside it (the layout transformers writes). The
shards are described through the format registry (``describe_part``); their weights are read,
and read again for the check, as their own format reads them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ptconvert.errors import CorruptFileError, InputError, TruncatedFileError
from ptconvert.formats.base import FileInfo, Format, Probe, file_entry
from ptconvert.formats.checkpoint_reference import pickle_reference
from ptconvert.formats.checkpoint_weights import read_checkpoint_weights
from ptconvert.formats.pt import PtFormat
from ptconvert.formats.reference import Reference
from ptconvert.formats.safetensors import read_safetensors, safetensors_reference
from ptconvert.formats.weightset import WeightSet


def read_index(path: Path) -> dict[str, Any]:
    try:
        index = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptFileError(f"shard index is not valid JSON ({exc})", path=path) from None
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        raise CorruptFileError("shard index has no weight_map object", path=path)
    return index


def shard_paths(index: Path) -> list[Path]:
    """The shard files an index names (loading the index loads them), those that exist, in
    order; none when ``index`` is not a readable index."""
    try:
        names = sorted({str(n) for n in read_index(index)["weight_map"].values()})
    except (InputError, OSError):
        return []
    return [index.parent / n for n in names if (index.parent / n).is_file()]


def shard_kind(names: list[str]) -> str | None:
    if names and all(n.endswith(".safetensors") for n in names):
        return "safetensors"
    if names and all(n.endswith(".bin") or n.endswith(".pt") for n in names):
        return "pt"
    return None


class ShardedFormat(Format):
    name = "sharded"
    written_by = "--to safetensors --max-shard-size 5GB"
    suffixes = (".index.json",)
    holds = "a set of safetensors or pickle shards with a weight_map index (transformers layout)"
    priority = 10

    def match(self, probe: Probe) -> str | None:
        head = probe.head.lstrip()
        if not head.startswith(b"{") or b'"weight_map"' not in probe.head + probe.tail:
            return None
        try:
            index = read_index(probe.path)
        except InputError:
            return None
        return shard_kind(sorted(set(index["weight_map"].values())))

    read_label = "read every shard"
    reference_without_torch = True  # safetensors or pickle records: no tensor built

    def read_weights(
        self, path: Path, layout: str, key: str | None, skip_unsupported: bool
    ) -> WeightSet:
        shards = _shards(path)
        if layout == "safetensors":
            return read_safetensors(shards)
        parts = [read_checkpoint_weights(s, _pt_layout(s, path), None, False) for s in shards]
        merged = WeightSet([e for p in parts for e in p.entries], "fast")
        if any(p.path == "torch" for p in parts):
            merged.path = "torch"
        return merged

    def reference(self, ws: WeightSet, may_load: Callable[[], bool], stack: ExitStack) -> Reference:
        assert ws.origin is not None
        shards = _shards(ws.origin)
        if ws.layout == "safetensors":
            return safetensors_reference(shards, stack)
        return pickle_reference(ws, shards)

    def named_after(self, path: Path) -> Path:
        return path.parent

    def info(self, path: Path, layout: str) -> FileInfo:
        index = read_index(path)
        shards = sorted(set(index["weight_map"].values()))
        info = FileInfo(str(path), self.name, layout, path.stat().st_size, [file_entry(path)])
        info.shards = shards
        info.metadata = dict(index.get("metadata") or {})
        info.add_tensors([])
        for shard in shards:
            spath = path.parent / shard
            if not spath.exists():
                raise TruncatedFileError(
                    f"shard {shard!r} named in the index is missing",
                    path=path,
                    hint="download or copy every shard next to the index",
                )
            sub = self.describe_part(spath)
            info.files.append(file_entry(spath))
            info.size_bytes += sub.size_bytes
            info.globals = sorted({*info.globals, *sub.globals})
            info.needs_code = sorted({*info.needs_code, *sub.needs_code})
            info.merge_tensors(sub)
        return info


def _shards(index: Path) -> list[Path]:
    """The shards an index names, every one of them there (one gone is a truncated set)."""
    shards = [index.parent / s for s in sorted(set(read_index(index)["weight_map"].values()))]
    for shard in shards:
        if not shard.is_file():
            raise TruncatedFileError(
                f"shard {shard.name!r} named in the index is missing",
                path=index,
                hint="download or copy every shard next to the index",
            )
    return shards


def _pt_layout(shard: Path, index: Path) -> str:
    layout = PtFormat().match(Probe(shard))
    if layout is None:
        raise CorruptFileError(f"not a torch checkpoint (a shard of {index.name})", path=shard)
    return layout
