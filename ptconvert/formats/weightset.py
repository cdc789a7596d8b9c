"""What reading a weights-holding file gives: a flat list of named tensors and where each one's
bytes are. Every format that can give its weights (``Format.read_weights``) returns a WeightSet;
the writers (``Format.write_weights``) and the bitwise check take one.

An entry's bytes are a byte range of a file when they can be copied as they are, or a torch tensor
rebuilt in memory otherwise (compressed members, non-contiguous views, big-endian storages,
dequantized GGUF blocks)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ALIASES_KEY = "ptconvert.aliases"  # safetensors metadata: JSON {alias name: stored name}


@dataclass(frozen=True)
class ByteRange:
    path: Path
    offset: int


@dataclass
class WeightEntry:
    name: str
    dtype: str  # torch's dtype name: "float32", "bfloat16", …
    shape: tuple[int, ...]
    nbytes: int
    source: ByteRange | None = None
    tensor: Any = None  # torch.Tensor when the bytes are not a plain file range
    alias_of: str | None = None  # tied: the entry whose data this one shares


@dataclass
class WeightSet:
    entries: list[WeightEntry]
    path: str  # "fast" (every tensor a byte range) or "torch" (some rebuilt in memory by torch)
    metadata: dict[str, str] = field(default_factory=dict)
    unwrapped: str | None = None
    stripped_prefix: str | None = None
    other_contents: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # tensors left out, name (as the entries are named) → why (``--skip-unsupported``)
    skipped: dict[str, str] = field(default_factory=dict)
    origin: Path | None = None  # the file read (a shard index for sharded sets)
    format: str = ""  # its format and layout, as detected
    layout: str = ""
    # files written beside the weights (a config.json the source's metadata makes): a set that
    # has them is written as a directory by default
    companions: dict[str, bytes] = field(default_factory=dict)
    cast_to: str | None = None  # --dtype: its floating entries were cast to it (weights/cast.py)

    @property
    def stored(self) -> list[WeightEntry]:
        return [e for e in self.entries if e.alias_of is None]


def weights_from_tensors(tensors: dict[str, Any]) -> WeightSet:
    """A weight set over in-memory tensors (from a loaded program); tied tensors become aliases."""
    entries: list[WeightEntry] = []
    seen: dict[tuple[object, ...], str] = {}
    for name, t in tensors.items():
        t = t.detach()
        ident = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        dtype = str(t.dtype).removeprefix("torch.")
        nbytes = t.numel() * t.element_size()
        if ident in seen:
            entries.append(WeightEntry(name, dtype, tuple(t.shape), nbytes, alias_of=seen[ident]))
            continue
        seen[ident] = name
        entries.append(WeightEntry(name, dtype, tuple(t.shape), nbytes, tensor=t))
    return WeightSet(entries, "torch")
