"""``--dtype`` on weights: the floating tensors of a weight set cast to one precision, the others
(integers, booleans, float8, complex) kept as they are, tied entries still tied; and a
``config.json`` saying the new dtype, as transformers reads it."""

from __future__ import annotations

import json
import math
from typing import Any

from ptconvert.formats.weightset import WeightEntry, WeightSet

# the floating dtypes --dtype casts (float8 kinds are a quantized storage, not a precision)
CAST_DTYPES = ("float64", "float32", "float16", "bfloat16")
ITEM_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


def casts(dtype: str, to: str) -> bool:
    """Whether ``--dtype to`` changes a tensor of ``dtype``."""
    return dtype in CAST_DTYPES and dtype != to


def cast_weights(ws: WeightSet, to: str) -> str:
    """Each floating entry of ``ws`` replaced by its cast to ``to`` (in memory, read from the
    source's bytes once); returns the report's note: what was cast, what was kept and why."""
    from ptconvert.deps import torch_dtype
    from ptconvert.weights.read import as_tensors

    target = torch_dtype(to, f"casting to {to}")
    tensors = as_tensors(WeightSet([e for e in ws.stored if casts(e.dtype, to)], ws.path))
    before = sum(e.nbytes for e in ws.stored)
    kept: dict[str, int] = {}
    entries: list[WeightEntry] = []
    for e in ws.entries:
        if e.alias_of is None and e.name in tensors:
            t = tensors[e.name].to(target).contiguous()
            entries.append(WeightEntry(e.name, to, e.shape, t.numel() * t.element_size(), tensor=t))
        elif e.alias_of is not None and casts(e.dtype, to):
            nbytes = math.prod(e.shape) * ITEM_BYTES[to]
            entries.append(WeightEntry(e.name, to, e.shape, nbytes, alias_of=e.alias_of))
        else:
            entries.append(e)
            if e.alias_of is None and e.dtype != to:
                kept[e.dtype] = kept.get(e.dtype, 0) + 1
    ws.entries, ws.path, ws.cast_to = entries, "torch", to
    after = sum(e.nbytes for e in ws.stored)
    note = f"{len(tensors)} floating tensors cast to {to} ({_size(before)} → {_size(after)})"
    if kept:
        listed = ", ".join(f"{n} {dtype}" for dtype, n in sorted(kept.items()))
        note += f"; kept as they are: {listed} (not a floating precision)"
    return note


def config_with_dtype(text: str, to: str) -> str:
    """A transformers ``config.json`` saying ``to``: its ``dtype`` (transformers 5) and
    ``torch_dtype`` (4.x, still read by 5) set where present, ``torch_dtype`` added otherwise."""
    config: dict[str, Any] = json.loads(text)
    keys = [k for k in ("dtype", "torch_dtype") if k in config] or ["torch_dtype"]
    for key in keys:
        config[key] = to
    for sub in config.values():  # a composite model's text/vision configs say theirs too
        if isinstance(sub, dict) and any(k in sub for k in ("dtype", "torch_dtype")):
            for key in ("dtype", "torch_dtype"):
                if key in sub:
                    sub[key] = to
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def _size(n: int) -> str:
    if n < 2**10:
        return f"{n} B"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"
