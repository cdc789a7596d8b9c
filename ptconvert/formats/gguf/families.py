"""Which Hugging Face decoders become which llama.cpp architecture, and how: the model's
hyperparameters as llama.cpp's metadata keys, the checkpoint's tensor names as its names
(gguf's own tensor-name map), and the q/k row order of its rope.

A family written here is one whose every tensor and every hyperparameter llama.cpp's
architecture has a place for; anything else (rope scaling, biases its loader drops, another
activation) is refused before any work, named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ptconvert.errors import UnsupportedConversionError


@dataclass(frozen=True)
class Family:
    arch: str  # gguf.MODEL_ARCH's member name
    # llama.cpp's rope pairs rows (2i, 2i+1) of each head; transformers' rotate_half pairs
    # rows (i, i + d/2): llama.cpp's converter reorders the q/k projections, transformers'
    # GGUF loader reorders them back (LLAMA only: Qwen2's llama.cpp rope is NEOX, HF's order)
    permutes_qk: bool
    biases: bool = False  # the q/k/v projections carry biases (Qwen2)


FAMILIES = {
    "llama": Family("LLAMA", permutes_qk=True),
    "mistral": Family("LLAMA", permutes_qk=True),  # llama.cpp writes Mistral as llama
    "qwen2": Family("QWEN2", permutes_qk=False, biases=True),
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
    rms_eps: float
    vocab: int
    tied: bool


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
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    return family, Hyper(
        context=int(config.get("max_position_embeddings") or 0),
        embedding=hidden,
        blocks=int(config["num_hidden_layers"]),
        feed_forward=int(config["intermediate_size"]),
        heads=heads,
        heads_kv=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        rope_base=float(_rope(config).get("rope_theta", config.get("rope_theta", 10000.0))),
        rms_eps=float(config.get("rms_norm_eps", 1e-6)),
        vocab=int(config["vocab_size"]),
        tied=bool(config.get("tie_word_embeddings", False)),
    )


def _rope(config: dict[str, Any]) -> dict[str, Any]:
    """transformers 5's ``rope_parameters``, or 4's ``rope_scaling`` (with ``rope_theta`` apart)."""
    found = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return found if isinstance(found, dict) else {}


def _refuse_unwritable(config: dict[str, Any], family: Family, kind: str, where: str) -> None:
    missing = [
        k
        for k in ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size")
        if k not in config
    ]
    rope = _rope(config).get("rope_type", _rope(config).get("type", "default"))
    act = config.get("hidden_act", config.get("hidden_activation", "silu"))
    why = []
    if missing:
        why.append(f"config.json lacks {', '.join(missing)}")
    if rope not in (None, "default"):
        why.append(f"rope scaling {rope!r} (llama.cpp's rope_freqs / scaling keys are not written)")
    if act != "silu":
        why.append(f"activation {act!r} (llama.cpp's {family.arch.lower()} runs SiLU)")
    if not family.biases and (config.get("attention_bias") or config.get("mlp_bias")):
        why.append("projection biases (transformers' GGUF loading of llama drops them)")
    if config.get("use_sliding_window") or config.get("layer_types"):
        kinds = set(config.get("layer_types") or ["sliding_attention"])
        if kinds != {"full_attention"}:
            why.append("sliding-window attention layers (llama.cpp's architecture attends fully)")
    if why:
        raise UnsupportedConversionError(
            f"a {kind} model llama.cpp's {family.arch.lower()} cannot hold as it is: "
            + "; ".join(why),
            path=where,
        )


def permute_qk(rows: Any, heads: int) -> Any:
    """Each head's rows reordered from transformers' halves (i, i + d/2) to llama.cpp's
    interleaved pairs (2i, 2i+1): row 2i + j of a head is its row j·d/2 + i. ``rows``: a
    (heads·d, …) torch tensor; the result is contiguous."""
    head = rows.shape[0] // heads
    halves = rows.reshape(heads, 2, head // 2, *rows.shape[1:])
    return halves.transpose(1, 2).reshape(rows.shape).contiguous()


def add_hyperparameters(writer: Any, family: Family, hyper: Hyper, name: str) -> None:
    """llama.cpp's metadata for the architecture (the keys its loader and transformers' GGUF
    loader read)."""
    writer.add_name(name)
    writer.add_context_length(hyper.context)
    writer.add_embedding_length(hyper.embedding)
    writer.add_block_count(hyper.blocks)
    writer.add_feed_forward_length(hyper.feed_forward)
    writer.add_head_count(hyper.heads)
    writer.add_head_count_kv(hyper.heads_kv)
    writer.add_rope_dimension_count(hyper.head_dim)
    writer.add_rope_freq_base(hyper.rope_base)
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
        if name.endswith("rotary_emb.inv_freq"):
            continue  # a buffer llama.cpp computes from rope.freq_base
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
