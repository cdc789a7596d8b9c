"""Rope scaling between a Hugging Face config and llama.cpp's GGUF, both ways.

llama.cpp holds linear scaling as two keys (``rope.scaling.type``/``factor``) and Llama 3's as
a ``rope_freqs`` tensor: per frequency of a head, the divisor of its angle. ``--to gguf`` computes
the divisors from the config as llama.cpp's converter does (``llama3_divisors``); a GGUF source
gets its config's ``rope_parameters`` back from the file (``rope_of_file``: transformers' GGUF
loading reads neither, and would give a model that rotates as if unscaled). Either way the
result is held to transformers' own rope code (``transformers_frequencies``) within
``RELATIVE``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RELATIVE = 1e-5  # float32's rounding of base^(i/d) and of the divisors, with room
FREQS = "rope_freqs.weight"  # llama.cpp's name of Llama 3's divisors


def wavelengths(head_dim: int, base: float) -> list[float]:
    """Each frequency's wavelength in positions, the highest frequency first."""
    return [2 * math.pi * base ** (i / head_dim) for i in range(0, head_dim, 2)]


def llama3_divisors(rope: dict[str, Any], head_dim: int, base: float) -> list[float]:
    """Llama 3's rope by llama.cpp's converter's formula: 1 for wavelengths under the
    high-frequency one, ``factor`` over the low-frequency one, a smooth step between (missing
    parameters take Llama 3.1's values; the caller gives the context transformers defaults to,
    the model's own). The engine refuses ``high_freq_factor`` ≤ ``low_freq_factor`` first."""
    factor = float(rope.get("factor", 8.0))
    low, high = float(rope.get("low_freq_factor", 1.0)), float(rope.get("high_freq_factor", 4.0))
    context = float(rope.get("original_max_position_embeddings", 8192))
    out = []
    for wavelength in wavelengths(head_dim, base):
        if wavelength < context / high:
            out.append(1.0)
        elif wavelength > context / low:
            out.append(factor)
        else:
            smooth = (context / wavelength - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


def llama3_parameters(divisors: Sequence[float], head_dim: int, base: float) -> dict[str, Any]:
    """Parameters of transformers' ``llama3`` rope (``linear`` where every divisor is the same)
    that give these divisors, or {} where none does. Llama 3's divisors depend on its context
    and frequency factors only through two wavelengths (where the smooth step starts and ends):
    the context is the whole number nearest the first (``low_freq_factor`` 1 where it is
    whole, as Llama 3's), and the two wavelengths are fitted to the smoothed
    divisors (chosen inside the gaps between classes where fewer than two are smoothed: any
    choice there gives the same divisors)."""
    d = [float(x) for x in divisors]
    if len(d) != head_dim // 2 or not d or not all(math.isfinite(x) and x > 0 for x in d):
        return {}
    factor = max(d)
    if factor <= 1.0:
        return {}
    try:
        return _fitted(d, factor, head_dim, base)
    except ZeroDivisionError:  # smoothed divisors no straight line runs through
        return {}


def _fitted(d: list[float], factor: float, head_dim: int, base: float) -> dict[str, Any]:
    kind = [0 if x <= 1 + 1e-6 else 2 if x >= factor * (1 - 1e-6) else 1 for x in d]
    if kind == [2] * len(d):
        return {"rope_type": "linear", "factor": factor}
    if kind != sorted(kind):  # Llama 3's classes run from the highest frequency down
        return {}
    u = [1 / w for w in wavelengths(head_dim, base)]  # decreasing
    share = [(1 / x - 1 / factor) / (1 - 1 / factor) for x in d]  # 1 unscaled … 0 scaled
    smooth = [(u[i], share[i]) for i, k in enumerate(kind) if k == 1]
    plain = kind.count(0)
    top = u[plain - 1] if plain else 2 * u[0]  # the lowest unscaled frequency's
    bottom = u[kind.index(2)]  # the highest fully scaled frequency's
    if len(smooth) >= 2:  # s = a·u + b through the smoothed points (least squares)
        mu = sum(x for x, _ in smooth) / len(smooth)
        ms = sum(s for _, s in smooth) / len(smooth)
        a = sum((x - mu) * (s - ms) for x, s in smooth) / sum((x - mu) ** 2 for x, _ in smooth)
        b = ms - a * mu
        u_one, u_zero = (1 - b) / a, -b / a
    elif smooth:  # one point: a line through it steep enough to end inside both gaps
        (x, s) = smooth[0]
        a = 2 * max((1 - s) / (top - x), s / (x - bottom))
        u_one, u_zero = x + (1 - s) / a, x - s / a
    else:  # none: both ends inside the gap
        u_one, u_zero = top ** (2 / 3) * bottom ** (1 / 3), top ** (1 / 3) * bottom ** (2 / 3)
    if not 0 < u_zero < u_one:
        return {}
    # a whole context (transformers' config takes one), the factors placing both ends: rounded
    # to 6 places where that keeps the divisors (Llama 3's 1 and 4), else as fitted
    context = max(1, round(1 / u_zero))
    for places in (6, 17):
        found = {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": round(context * u_zero, places),
            "high_freq_factor": round(context * u_one, places),
            "original_max_position_embeddings": context,
        }
        again = llama3_divisors(found, head_dim, base)
        if max(abs(x - y) / y for x, y in zip(again, d, strict=True)) < RELATIVE / 4:
            break
    return found


def plain_frequencies(head_dim: int, base: float) -> Any:
    """The unscaled inverse frequencies (float64)."""
    import torch

    return 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def transformers_frequencies(config: Any) -> tuple[Any, float]:
    """The inverse frequencies and attention factor transformers' rope code gives ``config``."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kind = config.rope_parameters.get("rope_type", "default")
    if kind == "default":
        head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return plain_frequencies(head, config.rope_parameters["rope_theta"]), 1.0
    inv, attention = ROPE_INIT_FUNCTIONS[kind](config, None)
    return inv.double(), float(attention)


def off_by(got: Any, want: Any) -> float:
    """The largest relative difference of two frequency vectors (inf: other lengths)."""
    if got.shape != want.shape:
        return math.inf
    return float(((got - want).abs() / want.abs()).max())


# llama.cpp's rope tensors: Llama 3's divisors, Phi-3's long-context factor sets (longrope)
ROPE_TENSORS = (FREQS, "rope_factors_long.weight", "rope_factors_short.weight")


def rope_of_file(
    path: Path, metadata: dict[str, Any], found: dict[str, list[float]], config: Any
) -> str:
    """Give ``config`` (transformers' from the GGUF) the rope scaling llama.cpp would run the
    file with, where transformers' loading left it unscaled: the ``rope_freqs`` divisors as the
    llama3 (or linear) parameters that give them, a scaling factor (llama.cpp applies it under
    type linear, none or no type) as linear. ``found``: the file's ``ROPE_TENSORS`` by name.
    Returns the note ("" where there is nothing to carry: no rope, no scaling, or a scaling
    transformers read itself); UnsupportedConversionError for a scaling it would drop that
    is none of these."""
    from ptconvert.errors import UnsupportedConversionError

    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict) or "rope_theta" not in params:
        return ""  # no rope (GPT-2, T5, …), or one per layer type (Gemma 3): left as loaded
    if params.get("rope_type", "default") != "default":
        return ""  # transformers read the scaling itself (gpt-oss's yarn)
    arch = str(metadata.get("general.architecture", ""))
    kind = metadata.get(f"{arch}.rope.scaling.type")
    factor = metadata.get(f"{arch}.rope.scaling.factor", metadata.get(f"{arch}.rope.scale_linear"))
    factor = float(factor) if factor is not None else 1.0
    linear = kind in (None, "none", "linear") and factor not in (0.0, 1.0)
    base = float(params["rope_theta"])
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    head = int(metadata.get(f"{arch}.rope.dimension_count", head))
    divisors = found.get(FREQS)
    others = sorted(set(found) - {FREQS})

    def refuse(what: str) -> UnsupportedConversionError:
        return UnsupportedConversionError(
            f"{what}: transformers' GGUF loading drops it, and ptconvert carries a linear "
            "factor and Llama 3's rope_freqs only",
            path=path,
        )

    if others:
        raise refuse(f"rope factors {others} (Phi-3's longrope)")
    if kind not in (None, "none", "linear"):
        raise refuse(f"rope scaling {kind!r}")
    if divisors is not None and linear:
        raise refuse(f"{FREQS} and a linear factor {factor:g} both")
    if divisors and all(abs(x - 1.0) < 1e-6 for x in divisors):
        return f"{FREQS} holds no scaling (every divisor 1): config.json's rope is unscaled"
    if divisors is not None:
        scaled = llama3_parameters(divisors, head, base)  # {}: none, or not head's length
        want = plain_frequencies(head, base) / _tensor(divisors) if scaled else None
        source = f"{FREQS} ({len(divisors)} divisors)"
    elif linear:
        scaled = {"rope_type": "linear", "factor": factor} if factor > 0 else {}
        want = plain_frequencies(head, base) / abs(factor)
        source = f"rope.scaling factor {factor:g}"
    else:
        return ""
    config.rope_parameters = {**params, **scaled}
    off = off_by(transformers_frequencies(config)[0], want) if scaled else math.inf
    if off > RELATIVE:
        config.rope_parameters = params
        raise UnsupportedConversionError(
            f"the file's rope scaling ({source}) is no linear or llama3 scaling transformers "
            "computes: its model would rotate otherwise than llama.cpp",
            path=path,
        )
    return (
        f"rope scaling from {source} carried into config.json as {scaled['rope_type']} "
        f"rope_parameters (transformers' GGUF loading reads none): its frequencies within "
        f"{off:.1e} of llama.cpp's"
    )


def _tensor(values: Any) -> Any:
    import torch

    return torch.tensor([float(x) for x in values], dtype=torch.float64)
