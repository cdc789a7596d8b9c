"""Which Hugging Face decoders become which llama.cpp architecture, and how: the model's
hyperparameters as llama.cpp's metadata keys, the checkpoint's tensor names as its names
(gguf's own tensor-name map), the q/k row order of its rope and GPT-2's Conv1D orientation.
Families: llama, mistral (as llama), qwen2, phi3, gpt2; Gemma is not written (transformers'
GGUF loading, one of the checks, reads gemma2/gemma3 only, whose soft-capping, sliding windows
and shifted norms need more than a tensor-name map).

A family written here is one whose every tensor and every hyperparameter llama.cpp's
architecture has a place for; anything else (rope scaling other than linear and Llama 3's,
biases its loader drops, another activation) is refused before any work, named. Rope scaling is
written as llama.cpp's converter writes it (``ROPE_SCALINGS``): linear as its two scaling keys,
Llama 3's as a ``rope_freqs`` tensor of per-frequency divisors (``rope.llama3_divisors``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ptconvert.errors import UnsupportedConversionError
from ptconvert.formats.rope_config import rope_parameters, rope_type


@dataclass(frozen=True)
class Family:
    arch: str  # gguf.MODEL_ARCH's member name
    # llama.cpp's rope pairs rows (2i, 2i+1) of each head; transformers' rotate_half pairs
    # rows (i, i + d/2): llama.cpp's converter reorders the q/k projections, transformers'
    # GGUF loader reorders them back (LLAMA only: Qwen2's llama.cpp rope is NEOX, HF's order)
    permutes_qk: bool
    biases: bool = False  # the q/k/v projections carry biases (Qwen2)
    # the hidden activations llama.cpp's architecture runs (GPT-2's GELU: the tanh form)
    activations: tuple[str, ...] = ("silu",)
    rope: bool = True  # False: learned position embeddings (GPT-2), no rope metadata
    layer_norm: bool = False  # LayerNorm with biases (its eps key), not RMSNorm
    # llama.cpp's names of the matrices the checkpoint stores (in, out) as GPT-2's Conv1D does:
    # written transposed, (out, in) as every other matrix (transformers' loader undoes it)
    transposed: tuple[str, ...] = ()


GPT2_CONV1D = ("attn_qkv.weight", "attn_output.weight", "ffn_up.weight", "ffn_down.weight")


FAMILIES = {
    "llama": Family("LLAMA", permutes_qk=True),
    "mistral": Family("LLAMA", permutes_qk=True),  # llama.cpp writes Mistral as llama
    "qwen2": Family("QWEN2", permutes_qk=False, biases=True),
    # fused qkv_proj and gate_up_proj, as llama.cpp's phi3 holds them; its rope is NEOX
    "phi3": Family("PHI3", permutes_qk=False),
    "gpt2": Family(
        "GPT2",
        permutes_qk=False,
        biases=True,
        activations=("gelu_new", "gelu_pytorch_tanh"),
        rope=False,
        layer_norm=True,
        transposed=GPT2_CONV1D,
    ),
}
# config.json's names for each hyperparameter: Llama's, then GPT-2's
KEYS = {
    "hidden_size": ("hidden_size", "n_embd"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer"),
    "intermediate_size": ("intermediate_size", "n_inner"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions"),
    "activation": ("hidden_act", "hidden_activation", "activation_function"),
}


@dataclass(frozen=True)
class Hyper:
    """The hyperparameters llama.cpp reads, from config.json."""

    context: int
    embedding: int
    blocks: int
    feed_forward: int
    heads: int
    heads_kv: int
    head_dim: int
    rope_base: float
    rms_eps: float  # the norms' epsilon (LayerNorm's where the family has it)
    vocab: int
    tied: bool
    rope_type: str = "default"  # the config's rope scaling: a key of ROPE_SCALINGS
    rope_factor: float = 1.0  # linear's factor (llama3's factors are a tensor)


# rope scalings llama.cpp holds as transformers computes them → the one architecture that reads
# it (None: every architecture). linear: rope.scaling.type/factor, read by llama.cpp's generic
# hparams (its angle · 1/factor); llama3: a rope_freqs tensor, read by its llama alone (each
# frequency's angle divided by its factor). yarn, longrope and dynamic need more (an attention
# factor, two factor sets, a length-dependent base): refused
ROPE_SCALINGS: dict[str, str | None] = {"default": None, "linear": None, "llama3": "LLAMA"}


def family_of(config: dict[str, Any], where: str) -> tuple[Family, Hyper]:
    """The family and hyperparameters of a config.json, or UnsupportedConversionError naming
    what llama.cpp's architecture has no place for."""
    kind = config.get("model_type")
    family = FAMILIES.get(str(kind))
    if family is None:
        raise UnsupportedConversionError(
            f"--to gguf writes Hugging Face decoders of the families {', '.join(FAMILIES)}; "
            f"this directory's config.json says model_type {kind!r}",
            path=where,
        )
    _refuse_unwritable(config, family, str(kind), where)
    hidden, heads = int(_get(config, "hidden_size")), int(_get(config, "num_attention_heads"))
    eps = config.get("layer_norm_epsilon" if family.layer_norm else "rms_norm_eps")
    return family, Hyper(
        context=int(_get(config, "max_position_embeddings") or 0),
        embedding=hidden,
        blocks=int(_get(config, "num_hidden_layers")),
        feed_forward=int(_get(config, "intermediate_size") or 4 * hidden),  # GPT-2's default
        heads=heads,
        heads_kv=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        rope_base=float(
            rope_parameters(config).get("rope_theta", config.get("rope_theta", 10000.0))
        ),
        rms_eps=float(eps if eps is not None else 1e-5 if family.layer_norm else 1e-6),
        vocab=int(config["vocab_size"]),
        tied=bool(config.get("tie_word_embeddings", False)),
        rope_type=rope_type(config) if family.rope else "default",
        rope_factor=float(rope_parameters(config).get("factor", 1.0)),
    )


def _get(config: dict[str, Any], key: str) -> Any:
    """The first of ``KEYS[key]`` config.json has, else None."""
    return next((config[k] for k in KEYS[key] if config.get(k) is not None), None)


def _refuse_unwritable(config: dict[str, Any], family: Family, kind: str, where: str) -> None:
    required = ("hidden_size", "num_attention_heads", "num_hidden_layers")
    missing = [k for k in required if _get(config, k) is None]
    if family.rope and _get(config, "intermediate_size") is None:
        missing.append("intermediate_size")
    rope = rope_type(config) if family.rope else "default"
    act = _get(config, "activation") or family.activations[0]
    why = []
    if missing:
        why.append(f"config.json lacks {', '.join(missing)}")
    if rope not in ROPE_SCALINGS:
        written = ", ".join(k for k in ROPE_SCALINGS if k != "default")
        why.append(f"rope scaling {rope!r} (written here: {written})")
    elif ROPE_SCALINGS[rope] not in (None, family.arch):
        why.append(f"rope scaling {rope!r} (llama.cpp reads its rope_freqs for llama alone)")
    elif rope == "linear" and not float(rope_parameters(config).get("factor") or 0) > 0:
        why.append("linear rope scaling without a positive factor")
    elif rope == "llama3":
        found = rope_parameters(config)
        low, high = found.get("low_freq_factor", 1.0), found.get("high_freq_factor", 4.0)
        if not float(high) > float(low):
            why.append("llama3 rope scaling whose high_freq_factor is not above its low one")
    if act not in family.activations:
        why.append(
            f"activation {act!r} (llama.cpp's {family.arch.lower()} runs {family.activations[0]})"
        )
    if not family.biases and (config.get("attention_bias") or config.get("mlp_bias")):
        why.append("projection biases (transformers' GGUF loading of llama drops them)")
    if config.get("use_sliding_window") or config.get("layer_types"):
        kinds = set(config.get("layer_types") or ["sliding_attention"])
        if kinds != {"full_attention"}:
            why.append("sliding-window attention layers (llama.cpp's architecture attends fully)")
    if family.arch == "PHI3" and config.get("sliding_window") is not None:
        why.append("sliding-window attention (sliding_window is set)")
    if float(config.get("partial_rotary_factor") or 1.0) != 1.0:
        why.append("a partial rotary factor (rope over part of each head)")
    if family.arch == "GPT2":  # attention llama.cpp's gpt2 scales by 1/sqrt(d) alone
        if config.get("scale_attn_by_inverse_layer_idx"):
            why.append("attention scaled by the inverse layer index")
        if config.get("scale_attn_weights") is False:
            why.append("unscaled attention (scale_attn_weights false)")
        if config.get("add_cross_attention"):
            why.append("cross-attention")
        why += _gpt2_unchecked(config)
    if why:
        raise UnsupportedConversionError(
            f"a {kind} model llama.cpp's {family.arch.lower()} cannot hold as it is: "
            + "; ".join(why),
            path=where,
        )


def _gpt2_unchecked(config: dict[str, Any]) -> list[str]:
    """What transformers' GGUF loading of gpt2 (one of the checks) cannot read back: its config
    takes neither feed_forward_length nor context_length (GPT-2's defaults stand: 4·n_embd,
    1024 positions), so a GPT-2 of other sizes could not be checked."""
    why = []
    hidden = _get(config, "hidden_size")
    inner = _get(config, "intermediate_size")
    if inner is not None and hidden is not None and int(inner) != 4 * int(hidden):
        why.append(
            f"a feed-forward width {inner} ≠ 4·n_embd (transformers' GGUF loading, which checks "
            "the file, reads GPT-2's as 4·n_embd)"
        )
    positions = _get(config, "max_position_embeddings")
    if positions is not None and int(positions) != 1024:
        why.append(
            f"n_positions {positions} ≠ 1024 (transformers' GGUF loading, which checks the "
            "file, reads GPT-2's as 1024)"
        )
    return why


def permute_qk(rows: Any, heads: int) -> Any:
    """Each head's rows reordered from transformers' halves (i, i + d/2) to llama.cpp's
    interleaved pairs (2i, 2i+1): row 2i + j of a head is its row j·d/2 + i. ``rows``: a
    (heads·d, …) torch tensor; the result is contiguous."""
    head = rows.shape[0] // heads
    halves = rows.reshape(heads, 2, head // 2, *rows.shape[1:])
    return halves.transpose(1, 2).reshape(rows.shape).contiguous()


# llama.cpp's vocabulary loader, for a model whose general.name holds "phi-3" or "phi3" (any
# case, any architecture), looks these tokens up by text and fails to load one without them
PHI3_NAMED_TOKENS = ("</s>", "<unk>", "<s>", "<|endoftext|>")


def general_name(name: str, tokens: list[str]) -> str | None:
    """``name`` as general.name, or None (not written: the key is optional) where llama.cpp
    would take it for Phi-3's and fail on a vocabulary lacking Phi-3's tokens."""
    phi3_named = any(k in name.lower() for k in ("phi-3", "phi3"))
    return None if phi3_named and not set(PHI3_NAMED_TOKENS) <= set(tokens) else name


def add_hyperparameters(writer: Any, family: Family, hyper: Hyper, name: str | None) -> None:
    """llama.cpp's metadata for the architecture (the keys its loader and transformers' GGUF
    loader read); general.name where ``name`` is given."""
    if name is not None:
        writer.add_name(name)
    writer.add_context_length(hyper.context)
    writer.add_embedding_length(hyper.embedding)
    writer.add_block_count(hyper.blocks)
    writer.add_feed_forward_length(hyper.feed_forward)
    writer.add_head_count(hyper.heads)
    writer.add_head_count_kv(hyper.heads_kv)
    if family.rope:
        writer.add_rope_dimension_count(hyper.head_dim)
        writer.add_rope_freq_base(hyper.rope_base)
    if hyper.rope_type == "linear":
        import gguf

        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(hyper.rope_factor)
    if family.layer_norm:
        writer.add_layer_norm_eps(hyper.rms_eps)
    else:
        writer.add_layer_norm_rms_eps(hyper.rms_eps)
    writer.add_vocab_size(hyper.vocab)
    if hyper.head_dim != hyper.embedding // hyper.heads:
        writer.add_key_length(hyper.head_dim)
        writer.add_value_length(hyper.head_dim)


def tensor_names(names: list[str], family: Family, hyper: Hyper, where: str) -> dict[str, str]:
    """The checkpoint's name → llama.cpp's (gguf's tensor-name map for the architecture);
    a tensor it has no name for is refused, named."""
    import gguf

    arch = getattr(gguf.MODEL_ARCH, family.arch)
    table = gguf.get_tensor_name_map(arch, hyper.blocks)
    out: dict[str, str] = {}
    unknown = []
    for name in names:
        if name.endswith(("rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")):
            continue  # buffers: llama.cpp computes rope from freq_base, masks causally itself
        mapped = table.get_name(name, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            unknown.append(name)
        else:
            out[name] = mapped
    if unknown:
        raise UnsupportedConversionError(
            f"{len(unknown)} tensors llama.cpp's {family.arch.lower()} has no name for: "
            f"{unknown[:5]}",
            path=where,
        )
    return out
