"""Tiny Hugging Face decoders with a byte-level BPE tokenizer.json, as --to gguf takes them."""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = 272  # 256 bytes, 8 merges, one special token, 7 ids the tokenizer leaves unused
MERGES = [
    ("h", "e"),
    ("l", "l"),
    ("Ġ", "t"),
    ("he", "ll"),
    ("o", "Ġ"),
    ("Ġt", "h"),
    ("e", "r"),
    ("i", "n"),
]
SPECIAL = "<|endoftext|>"
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def byte_alphabet() -> list[str]:
    from gguf.vocab import bytes_to_unicode

    return list(bytes_to_unicode().values())


def write_byte_level_tokenizer(folder: Path) -> None:
    """tokenizer.json (GPT-2's ByteLevel pre-tokenizer and decoder, a few merges, one special
    token) and tokenizer_config.json naming it bos/eos, with a chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(byte_alphabet())}
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, MERGES))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(SPECIAL, special=True)])
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "bos_token": SPECIAL,
        "eos_token": SPECIAL,
        "add_bos_token": False,
        "chat_template": TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def build_decoder(
    kind: str,
    folder: Path,
    *,
    dtype: str = "float32",
    rope: dict[str, object] | None = None,
    sentencepiece: bool = False,
) -> Path:
    """A tiny ``llama``, ``qwen2``, ``phi3`` or ``gpt2`` causal LM saved as safetensors with its
    tokenizer. The feed-forward width (80; GPT-2's 4·64) is no multiple of q8_0's 32-value
    blocks: its down projection's rows are not (llama.cpp writes it f16). ``rope``: its
    ``rope_parameters`` (a rope scaling), not GPT-2's. ``sentencepiece``: Llama 2's kind of
    tokenizer (``write_sentencepiece_tokenizer``, bos 1 and eos 2) instead of the byte-level
    BPE."""
    import torch
    import transformers as t

    torch.manual_seed(0)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.2,
        bos_token_id=256 + len(MERGES),
        eos_token_id=256 + len(MERGES),
    )
    if sentencepiece:
        common.update(vocab_size=SP_VOCAB, bos_token_id=1, eos_token_id=2)
    if kind == "gpt2":  # its own names; LayerNorm, learned positions, Conv1D (in, out) weights
        model = t.GPT2LMHeadModel(t.GPT2Config(**gpt2_config(common))).eval()
    else:
        config, cls = {
            "llama": (t.LlamaConfig, t.LlamaForCausalLM),
            "qwen2": (t.Qwen2Config, t.Qwen2ForCausalLM),
            "phi3": (t.Phi3Config, t.Phi3ForCausalLM),
        }[kind]
        # its default pad id, 32000, is past VOCAB: an unused id (gguf writes it from config.json)
        extra: dict[str, object] = {"pad_token_id": VOCAB - 1} if kind == "phi3" else {}
        if rope is not None:
            extra["rope_parameters"] = rope
        model = cls(config(**common, **extra)).eval()
    with torch.no_grad():  # norms away from 1, biases away from 0: one written wrong shows
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_((0 if name.endswith("bias") else 1) + 0.3 * torch.randn_like(p))
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    if sentencepiece:
        write_sentencepiece_tokenizer(folder)
    else:
        write_byte_level_tokenizer(folder)
    return folder


def gpt2_config(common: dict[str, object]) -> dict[str, object]:
    """The Llama sizes under GPT-2's config names (no GQA: a KV head per head); its
    feed-forward 4·n_embd and 1024 positions, GPT-2's own, the only ones transformers' GGUF
    loading reads back (ptconvert refuses others)."""
    return {
        "vocab_size": common["vocab_size"],
        "n_embd": common["hidden_size"],
        "n_layer": common["num_hidden_layers"],
        "n_head": common["num_attention_heads"],
        "n_positions": 1024,
        "initializer_range": common["initializer_range"],
        "bos_token_id": common["bos_token_id"],
        "eos_token_id": common["eos_token_id"],
    }


# Llama 3.1's rope scaling at this size: its original context 64 (Llama 3.1's is 8192) puts the
# head's 8 frequencies (wavelengths 6.3 … 19 869 positions) in all three of its ranges: 1 under
# 16, smoothed up to 64, 8 above; a linear scaling ×4
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
LINEAR_ROPE = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}


# A sentencepiece-style BPE (Llama 2's, TinyLlama's, Mistral 7B's tokenizer.json): <unk>, <s>,
# </s>, the 256 byte-fallback tokens <0x00>…<0xFF>, then pieces by priority; every split of a
# piece into two pieces is a merge, ranked by the piece (as transformers' converter of a
# sentencepiece model writes them)
SP_PIECES = ["▁", "h", "e", "l", "o", "t", "r", "i", "n", "a", "s", "d", "w"]
SP_MERGED = ["▁t", "he", "ll", "in", "er", "▁the", "▁h", "hell", "▁hell", "re", "▁a", "an", "▁w"]
SP_SIZE = 3 + 256 + len(SP_PIECES) + len(SP_MERGED)
SP_VOCAB = SP_SIZE + 3  # the model's vocab_size: 3 ids unused


def write_sentencepiece_tokenizer(folder: Path) -> None:
    """tokenizer.json (BPE with byte fallback, Llama 2's normalizer, decoder and <s> first)
    and tokenizer_config.json with <s>/</s>/<unk>; ids past SP_SIZE are unused."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    pieces = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)], *SP_PIECES]
    vocab = {p: i for i, p in enumerate([*pieces, *SP_MERGED])}
    merges = [
        (piece[:k], piece[k:])
        for piece in SP_MERGED
        for k in range(1, len(piece))
        if piece[:k] in vocab and piece[k:] in vocab
    ]
    model = models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    tok = Tokenizer(model)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "chat_template": TEMPLATE,
        "tokenizer_class": "LlamaTokenizerFast",
        "legacy": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
