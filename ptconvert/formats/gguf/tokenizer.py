"""The directory's tokenizer as llama.cpp's vocabulary: tokenizer.json's byte-level BPE as
llama.cpp's ``gpt2`` model (its tokens in id order, their types, the merges), its pre-tokenizer
named as llama.cpp names it, and the special ids, ``add_bos`` and the chat template through
gguf's ``SpecialVocab`` (tokenizer.json, tokenizer_config.json).

A tokenizer llama.cpp would split or spell otherwise (a sentencepiece-style BPE with byte
fallback, WordPiece, Unigram, a pre-tokenizer regex it has no name for) is refused before any
work, named: a file that tokenizes differently would load and generate other text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert.errors import UnsupportedConversionError

# the split regexes of byte-level BPE vocabularies (as their tokenizer.json files state them)
# → llama.cpp's pre-tokenizer names (``tokenizer.ggml.pre``); GPT-2's own is ByteLevel's regex
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS = {_LLAMA3: "llama-bpe", _QWEN2: "qwen2"}
GPT2_PRE = "gpt-2"

NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5  # gguf.TokenType's values


@dataclass
class Vocabulary:
    model: str  # tokenizer.ggml.model
    pre: str  # tokenizer.ggml.pre
    tokens: list[str] = field(default_factory=list)
    types: list[int] = field(default_factory=list)
    padded: int = 0  # ids the tokenizer leaves unused below the model's vocab_size


def vocabulary(folder: Path, vocab_size: int) -> Vocabulary:
    """tokenizer.json's vocabulary padded to the model's ``vocab_size`` rows (llama.cpp wants
    one token per embedding row), or UnsupportedConversionError naming what it cannot hold."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise UnsupportedConversionError(
            "--to gguf writes the vocabulary from tokenizer.json, which this directory lacks",
            path=folder,
        )
    data = json.loads(path.read_text(encoding="utf-8"))
    model = data.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        what = "sentencepiece-style BPE (byte fallback)" if model.get("byte_fallback") else None
        raise UnsupportedConversionError(
            f"tokenizer.json is a {what or repr(model.get('type'))} tokenizer; --to gguf writes "
            "byte-level BPE vocabularies (llama.cpp's gpt2 model) only",
            path=path,
        )
    vocab = Vocabulary("gpt2", _pre_name(data, path))
    by_id: dict[int, tuple[str, int]] = {i: (t, NORMAL) for t, i in model["vocab"].items()}
    for added in data.get("added_tokens") or []:
        kind = CONTROL if added.get("special") else USER_DEFINED
        by_id[int(added["id"])] = (added["content"], kind)
    if max(by_id, default=-1) >= vocab_size:
        raise UnsupportedConversionError(
            f"tokenizer.json has ids up to {max(by_id)}, past the model's vocab_size {vocab_size}",
            path=path,
        )
    for i in range(vocab_size):
        token, kind = by_id.get(i, (f"[PAD{i}]", UNUSED))
        vocab.tokens.append(token)
        vocab.types.append(kind)
    vocab.padded = vocab_size - len(by_id)
    return vocab


def _pre_name(data: dict[str, Any], path: Path) -> str:
    """llama.cpp's name of the pre-tokenizer: ByteLevel's own regex is GPT-2's; a Split regex
    before a ByteLevel without one must be one llama.cpp knows."""
    pre = data.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    byte_level = [s for s in steps if s.get("type") == "ByteLevel"]
    decoder = (data.get("decoder") or {}).get("type")
    if not byte_level or decoder != "ByteLevel":
        raise UnsupportedConversionError(
            "tokenizer.json's BPE is not byte-level (a ByteLevel pre-tokenizer and decoder), "
            "which llama.cpp's gpt2 model is",
            path=path,
        )
    splits = [s for s in steps if s.get("type") == "Split"]
    if not splits and byte_level[0].get("use_regex", True) and len(steps) == 1:
        return GPT2_PRE
    regex = (splits[0].get("pattern") or {}).get("Regex") if len(splits) == 1 else None
    if regex in PRE_TOKENIZERS and len(steps) == 2:
        return PRE_TOKENIZERS[regex]
    raise UnsupportedConversionError(
        "tokenizer.json's pre-tokenizer splits text by a rule llama.cpp has no name for "
        f"(known: GPT-2's ByteLevel, {', '.join(PRE_TOKENIZERS.values())})",
        path=path,
    )


def add_vocabulary(writer: Any, vocab: Vocabulary, folder: Path) -> list[str]:
    """The vocabulary, its merges, special ids and chat template written; the notes to say."""
    import logging

    import gguf

    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=len(vocab.tokens))
    quiet = logging.getLogger("gguf.vocab")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # it logs each key it sets
    try:
        special.add_to_gguf(writer, quiet=True)
    finally:
        quiet.setLevel(level)
    notes = [
        f"vocabulary: byte-level BPE, {len(vocab.tokens)} tokens, {len(special.merges)} merges, "
        f"pre-tokenizer {vocab.pre}, special ids {special.special_token_ids or 'none'}"
        + (", chat template" if special.chat_template else "")
    ]
    if vocab.padded:
        notes.append(
            f"{vocab.padded} ids the tokenizer leaves unused below vocab_size written as "
            "[PADn] tokens of type UNUSED (one token per embedding row)"
        )
    return notes
