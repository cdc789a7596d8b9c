"""Sharded weight sets: ``*.safetensors.index.json`` or ``pytorch_model.bin.index.json``.

The index maps each tensor name to a shard file beside it (the layout transformers writes). The
shards are described through the format registry, so this module knows no shard format itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ptconvert.errors import CorruptFileError, InputError, TruncatedFileError
from ptconvert.formats.base import FileInfo, Format, Probe, file_entry


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

    def info(self, path: Path, layout: str) -> FileInfo:
        from ptconvert.formats import describe  # the registry describes each shard

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
            sub = describe(spath)
            info.files.append(file_entry(spath))
            info.size_bytes += sub.size_bytes
            info.globals = sorted({*info.globals, *sub.globals})
            info.needs_code = sorted({*info.needs_code, *sub.needs_code})
            info.merge_tensors(sub)
        return info
