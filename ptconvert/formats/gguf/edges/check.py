"""The written GGUF checked two ways before it is published, by readers that are not its writer:

- every tensor read back by gguf's ``GGUFReader``, its llama.cpp row order undone here (numpy,
  the inverse written apart from the permutation), and compared with the source tensor: f32,
  f16 and bf16 bit for bit with the source cast to that type, q8_0, q4_0, q4_1, q5_0 and q5_1
  dequantized (``gguf.quants.dequantize``) within their block format's own bound (``_BOUNDS``;
  the f16 rounding of scale and minimum allowed);
- transformers' own GGUF loading (``AutoModelForCausalLM.from_pretrained(dir,
  gguf_file=…)``: its config from the metadata, its reverse permutation) run on token ids at two
  sequence lengths against the source model in float32: the logits within 1 % of their largest
  magnitude for f32 and f16 (5 % for bf16: accuracy's bfloat16 ceiling), cosine ≥ a per-scheme
  least for the block schemes (``MIN_COSINE``). Two float32 copies of the model must fit
  in half the memory available; a note says when they do not and only the tensors were checked.

Rope scaling (linear, Llama 3's) is read by llama.cpp and not by transformers' GGUF loading: the
rope llama.cpp will run, from the file's keys and ``rope_freqs`` read back, is compared with the
inverse frequencies transformers computes for the source (``_rope_back``), and the model
transformers loads from the file is given the source's scaling over the file's base before
its logits are compared.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path
from typing import Any

from ptconvert import progress
from ptconvert.convert.state import RunState
from ptconvert.errors import VerificationError
from ptconvert.formats.gguf.families import Family, Hyper

LENGTHS = (5, 17)  # the sequence lengths the logits are compared at
MAX_RELATIVE = 0.01  # f32 and f16: max |Δ logits| / max |logits|
# the least cosine of the logits per block scheme, measured first on the tiny test models
# (tests/formats/gguf_target_models.py: Llama and Qwen2, 64 wide, random weights of std 0.2,
# coarser to quantize than trained ones; the output matrix q8_0), worst over both models and
# the check's two lengths: q8_0 0.9994, q5_1 0.966, q5_0 0.948, q4_1 0.888, q4_0 0.853. Each
# least keeps a margin under that and stays above what a wrong model gives: q/k rows left in
# transformers' order give 0.61 (q4_0) and 0.65 (q8_0) at 17 tokens, and are refused
MIN_COSINE = {"q8_0": 0.99, "q5_0": 0.90, "q5_1": 0.90, "q4_0": 0.80, "q4_1": 0.80}
F16_ROUNDING = 2.0**-11  # the relative error of a value stored f16 (scale d, minimum m)
# each block type's error bound per value, in steps of its block (the step's f16 rounding, times
# the most steps a value is from zero, added):
# - q8_0: d = amax/127, x rounded to the nearest of d·(-127…127): half a step off at most;
# - q4_0, q5_0: d = max/-8 (/-16) with max the signed value of largest magnitude, x rounded to
#   d·(-8…7) (d·(-16…15)): the far end (-max) has no level of its own and is clipped one whole
#   step off, the others half a step;
# - q4_1, q5_1: d = (max-min)/15 (/31), x rounded to m + d·(0…15) (0…31): half a step, plus the
#   f16 rounding of the minimum m (2^-11·|m|, added apart).
# type → (the step from amax or from max-min, over how many steps, steps off, most steps)
_BOUNDS: dict[str, tuple[str, int, float, int]] = {
    "Q8_0": ("amax", 127, 0.5, 127),
    "Q4_0": ("amax", 8, 1.0, 8),
    "Q5_0": ("amax", 16, 1.0, 16),
    "Q4_1": ("range", 15, 0.5, 15),
    "Q5_1": ("range", 31, 0.5, 31),
}


def check_gguf(
    state: RunState,
    path: Path,
    plan: list[Any],
    tensors: dict[str, Any],
    family: Family,
    hyper: Hyper,
    scheme: str,
) -> None:
    """Both checks; a VerificationError naming the first thing that differs."""
    with progress.step("reading every tensor back (gguf.GGUFReader)"):
        state.notes.append(_tensors_back(path, plan, tensors, family))
        if hyper.rope_type != "default":
            state.notes.append(_rope_back(path, state.src, family, hyper))
    with progress.step("running the GGUF through transformers' GGUF loading"):
        state.notes.append(_logits(state, path, tensors, scheme))
    state.checked = "readback"


def _tensors_back(path: Path, plan: list[Any], tensors: dict[str, Any], family: Family) -> str:
    import gguf
    import numpy as np
    import torch

    reader = gguf.GGUFReader(path)
    arch = reader.get_field("general.architecture")
    written_arch = arch.contents() if arch is not None else None
    if written_arch != gguf.MODEL_ARCH_NAMES[getattr(gguf.MODEL_ARCH, family.arch)]:
        raise VerificationError(f"the GGUF reads back as architecture {written_arch!r}", path=path)
    found = {t.name: t for t in reader.tensors}
    missing = [p.name for p in plan if p.name not in found]
    if missing or len(found) != len(plan):
        raise VerificationError(
            f"the GGUF holds {len(found)} tensors, {len(plan)} written; missing {missing[:5]}",
            path=path,
        )
    exact, worst = 0, 0.0
    for p in plan:
        t = found[p.name]
        want = tensors[p.source].t() if p.transposed else tensors[p.source]
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if t.tensor_type.name != p.qtype or shape != tuple(want.shape):
            raise VerificationError(
                f"tensor {p.name}: {t.tensor_type.name} {shape} read back, {p.qtype} "
                f"{tuple(want.shape)} written",
                path=path,
            )
        data = np.ascontiguousarray(t.data)
        if p.qtype in _BOUNDS:
            got = gguf.quants.dequantize(data, t.tensor_type).reshape(shape)
            ratio = _block_error(_unpermuted(got, p.heads), want.to(torch.float32).numpy(), p.qtype)
            if ratio > 1.0:
                raise VerificationError(
                    f"tensor {p.name}: {p.qtype.lower()} off by {ratio:.2f}× its blocks' bound",
                    path=path,
                )
            worst = max(worst, ratio)
            continue
        dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[p.qtype]
        bits = _unpermuted(data.view(np.uint8).reshape(*shape[:-1], -1), p.heads)
        expected = want.to(dtype).contiguous().view(torch.uint8).numpy()
        if not np.array_equal(bits, expected.reshape(bits.shape)):
            raise VerificationError(
                f"tensor {p.name}: its {p.qtype} bytes differ from the source's cast to "
                f"{str(dtype).removeprefix('torch.')}",
                path=path,
            )
        exact += 1
    words = f"read back by gguf.GGUFReader: {len(plan)} tensors, {exact} bitwise equal"
    if exact < len(plan):
        words += (
            f", {len(plan) - exact} quantized within their blocks' bound (worst {worst:.2f}× of it)"
        )
    return words + " to the source (llama.cpp's q/k row order undone)"


def _unpermuted(rows: Any, heads: int) -> Any:
    """llama.cpp's q/k rows back in transformers' order: row j·d/2 + i of a head is its row
    2i + j."""
    if not heads:
        return rows
    head = rows.shape[0] // heads
    pairs = rows.reshape(heads, head // 2, 2, *rows.shape[1:])
    return pairs.swapaxes(1, 2).reshape(rows.shape)


def _block_error(got: Any, want: Any, qtype: str) -> float:
    """The worst block's error over its bound (≤ 1 passes): each 32 values along a row."""
    import numpy as np

    kind, levels, off, most = _BOUNDS[qtype]
    blocks = want.reshape(-1, 32)
    low = blocks.min(axis=1, keepdims=True)
    if kind == "amax":
        step = np.abs(blocks).max(axis=1, keepdims=True) / levels
        extra = 0.0
    else:
        step = (blocks.max(axis=1, keepdims=True) - low) / levels
        extra = np.abs(low) * F16_ROUNDING
    err = np.abs(got.reshape(-1, 32) - blocks)
    # 2^-20 of a step: float32's own rounding in the quantizer's arithmetic
    bound = step * (off + most * F16_ROUNDING + 2.0**-20) + extra + np.finfo(np.float32).tiny
    return float((err / bound).max())


def _logits(state: RunState, path: Path, tensors: dict[str, Any], scheme: str) -> str:
    from ptconvert.memory import available_bytes

    params = sum(t.numel() for k, t in tensors.items() if "#" not in k)
    need = 2 * 4 * params
    free = available_bytes()
    if free is not None and need > free // 2:
        return (
            f"logits not compared: two float32 copies of the model ({need / 2**30:.1f} GiB) "
            "exceed half the memory available; every tensor was"
        )
    import torch

    ours = _source_model(state.src, tensors)
    theirs = _gguf_model(path, ours.config)
    generator = torch.Generator().manual_seed(0)
    vocab = int(ours.config.vocab_size)
    words = []
    for length in LENGTHS:
        ids = torch.randint(0, vocab, (1, length), generator=generator)
        with torch.no_grad():
            want = ours(input_ids=ids).logits.double()
            got = theirs(input_ids=ids).logits.double()
        rel = float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))
        cos = float(torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0))
        least = MIN_COSINE.get(scheme)
        bad = cos < least if least is not None else rel > _max_relative(scheme)
        if bad:
            raise VerificationError(
                f"transformers' loading of the GGUF gives other logits than the source at "
                f"{length} tokens: max |Δ| {rel:.2%} of the largest, cosine {cos:.5f}",
                path=state.src,
            )
        words.append(f"{length} tokens: max |Δ| {rel:.2e} of the largest, cosine {cos:.6f}")
    least = MIN_COSINE.get(scheme)
    rule = f"cosine ≥ {least}" if least is not None else f"within {_max_relative(scheme):.0%}"
    return (
        f"transformers' GGUF loading gives the source model's float32 logits ({rule}): "
        + "; ".join(words)
    )


def _max_relative(scheme: str) -> float:
    """bf16 keeps 8 bits of mantissa to f16's 11: a tiny Llama's logits stray ~1 % of the
    largest, so bf16 is held to the precision issue's bfloat16 error ceiling instead."""
    if scheme == "bf16":
        from ptconvert.verify.accuracy import THRESHOLDS

        return THRESHOLDS["bfloat16"][1]
    return MAX_RELATIVE


@contextlib.contextmanager
def _quiet() -> Any:
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _source_model(folder: Path, tensors: dict[str, Any]) -> Any:
    """The source directory's model in float32, built from its config and the tensors read."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    with _quiet():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    weights = {k: t.to(torch.float32) for k, t in tensors.items() if "#" not in k}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise VerificationError(
            f"the source's tensors do not fit its model class: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}",
            path=folder,
        )
    if tied:
        model.tie_weights()
    return model.eval()


def _gguf_model(path: Path, source: Any) -> Any:
    """transformers' model of the GGUF; where the source's rope is scaled, given that scaling
    over the file's own base (its GGUF loading reads no scaling; ``_rope_back`` checks it)."""
    import torch
    from transformers import AutoModelForCausalLM

    with _quiet():
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
    scaled = dict(getattr(source, "rope_parameters", None) or {})
    if scaled.get("rope_type", "default") != "default":
        base = model.config.rope_parameters["rope_theta"]
        model.config.rope_parameters = {**scaled, "rope_theta": base}
        rotary = model.model.rotary_emb
        model.model.rotary_emb = type(rotary)(config=model.config)
    return model.eval()


def _rope_back(path: Path, folder: Path, family: Family, hyper: Hyper) -> str:
    """The inverse frequencies llama.cpp will rotate by, from the file (its rope base and
    dimension, then the scaling factor's keys or ``rope_freqs`` read back), against those
    transformers computes for the source (``rope.transformers_frequencies``)."""
    import gguf
    import numpy as np
    import torch
    from transformers import AutoConfig

    from ptconvert.formats.gguf import rope

    config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    want, attention = rope.transformers_frequencies(config)
    reader = gguf.GGUFReader(path)
    arch = gguf.MODEL_ARCH_NAMES[getattr(gguf.MODEL_ARCH, family.arch)]

    def key(name: str) -> Any:
        found = reader.get_field(name.format(arch=arch))
        return found.contents() if found is not None else None

    plain = rope.plain_frequencies(
        int(key(gguf.Keys.Rope.DIMENSION_COUNT)), float(key(gguf.Keys.Rope.FREQ_BASE))
    )
    freqs = next((t for t in reader.tensors if t.name == rope.FREQS), None)
    if hyper.rope_type == "llama3" and freqs is not None:
        factors = torch.from_numpy(np.array(freqs.data, dtype=np.float64))
        how = f"{rope.FREQS} ({len(factors)} divisors)"
    elif key(gguf.Keys.Rope.SCALING_TYPE) == "linear" and freqs is None:
        factors = torch.full_like(plain, float(key(gguf.Keys.Rope.SCALING_FACTOR)))
        how = f"rope.scaling linear ×{float(key(gguf.Keys.Rope.SCALING_FACTOR)):g}"
    else:
        raise VerificationError(
            f"the GGUF holds no {hyper.rope_type} rope scaling llama.cpp reads", path=path
        )
    off = rope.off_by(plain / factors, want)
    if off > rope.RELATIVE or attention != 1.0:
        raise VerificationError(
            f"llama.cpp would rotate by other frequencies than transformers' {hyper.rope_type} "
            f"rope: {off:.2e} off relatively",
            path=path,
        )
    return (
        f"rope scaling {hyper.rope_type} read back as {how}: llama.cpp's inverse frequencies "
        f"within {off:.1e} of transformers' for the source"
    )
