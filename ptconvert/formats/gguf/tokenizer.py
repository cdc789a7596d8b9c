"""The directory's tokenizer as llama.cpp's vocabulary: tokenizer.json's byte-level BPE as
llama.cpp's ``gpt2`` model (its tokens in id order, their types, the merges), its pre-tokenizer
named as llama.cpp names it; a sentencepiece-style BPE (byte fallback: Llama 2's, TinyLlama's,
Mistral 7B's tokenizer.json) as llama.cpp's ``llama`` model (tokens, scores, types, the space
prefix); and the special ids, ``add_bos`` and the chat template through gguf's
``SpecialVocab`` (tokenizer.json, tokenizer_config.json).

llama.cpp's ``llama`` tokenizer merges, among adjacent pieces, the pair whose concatenation
scores highest; transformers' BPE applies the lowest-ranked merge. A piece's score here is minus
the rank of the first merge that makes it, so the two agree where every split of a piece into two
pieces is a merge, as transformers' converter of a sentencepiece model writes them.

A tokenizer llama.cpp would split or spell otherwise (WordPiece, Unigram, a pre-tokenizer regex
it has no name for, a sentencepiece-style normalizer other than Llama's, merges no score order
reproduces, an added token over a piece's id) is refused before any work, named: a file that
tokenizes differently would load and generate other text.
"""

from __future__ import annotations

import json
import re
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

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # gguf.TokenType
BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # a byte-fallback token's text
SPACE = "▁"  # sentencepiece's space


@dataclass
class Vocabulary:
    model: str  # tokenizer.ggml.model
    pre: str  # tokenizer.ggml.pre
    tokens: list[str] = field(default_factory=list)
    types: list[int] = field(default_factory=list)
    padded: int = 0  # ids the tokenizer leaves unused below the model's vocab_size
    scores: list[float] = field(default_factory=list)  # the llama model's merge priorities
    space_prefix: bool = False  # the llama model: a space put before the text


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
    if model.get("type") != "BPE":
        raise UnsupportedConversionError(
            f"tokenizer.json is a {model.get('type')!r} tokenizer; --to gguf writes BPE "
            "vocabularies (byte-level: llama.cpp's gpt2 model; sentencepiece-style: its llama)",
            path=path,
        )
    pieces = model.get("byte_fallback")
    vocab = Vocabulary("llama", "default") if pieces else Vocabulary("gpt2", _pre_name(data, path))
    by_id: dict[int, tuple[str, int]] = {i: (t, NORMAL) for t, i in model["vocab"].items()}
    added = data.get("added_tokens") or []
    if pieces:
        vocab.space_prefix = _space_prefix(data, path)
        _refuse_unscorable(model, {int(a["id"]) for a in added}, path)
        by_id |= {i: (t, BYTE) for i, (t, _) in by_id.items() if BYTE_TOKEN.fullmatch(t)}
    for token in added:
        kind = CONTROL if token.get("special") else USER_DEFINED
        if pieces and token["content"] == model.get("unk_token"):
            kind = UNKNOWN  # as llama.cpp's converter types a tokenizer.model's unknown piece
        i = int(token["id"])
        if i in by_id and by_id[i][0] != token["content"]:
            raise UnsupportedConversionError(
                f"tokenizer.json's added token {token['content']!r} takes id {i} of the piece "
                f"{by_id[i][0]!r}: llama.cpp's vocabulary holds one token per id",
                path=path,
            )
        by_id[i] = (token["content"], kind)
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
    if pieces:
        vocab.scores = _scores(model, vocab.tokens)
    return vocab


def _merge_pairs(model: dict[str, Any]) -> list[tuple[str, str]]:
    """tokenizer.json's merges, either spelling ("a b" or ["a", "b"])."""
    pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in model["merges"]]
    return [(str(a), str(b)) for a, b in pairs]


def _scores(model: dict[str, Any], tokens: list[str]) -> list[float]:
    """Per token, minus the rank of the first merge that makes it (0: no merge makes it)."""
    rank: dict[str, int] = {}
    for i, (a, b) in enumerate(_merge_pairs(model)):
        rank.setdefault(a + b, i + 1)
    return [-float(rank.get(t, 0)) for t in tokens]


def _space_prefix(data: dict[str, Any], path: Path) -> bool:
    """Whether the sentencepiece-style tokenizer puts a space before the text: Llama's
    normalizer (Prepend "▁", Replace " " → "▁"; no pre-tokenizer), which llama.cpp's llama
    tokenizer follows at the start and after each special token. A Metaspace pre-tokenizer (a
    file transformers 5 saved) is refused: it skips the space where the text starts with one,
    and after special tokens under prepend_scheme "first", where llama.cpp does not."""
    normalizer = data.get("normalizer") or {}
    steps = normalizer.get("normalizers", [normalizer]) if normalizer else []
    kinds = [s.get("type") for s in steps]
    pre = data.get("pre_tokenizer") or {}
    replaces = [s for s in steps if s.get("type") == "Replace"]
    spaced = all((s.get("pattern") or {}).get("String") == " " and s.get("content") == SPACE
                 for s in replaces)  # fmt: skip
    if kinds and set(kinds) <= {"Prepend", "Replace"} and replaces and spaced and not pre:
        return "Prepend" in kinds
    found = pre.get("type") or (kinds and "/".join(str(k) for k in kinds)) or "none"
    raise UnsupportedConversionError(
        f"tokenizer.json's sentencepiece-style BPE splits text by {found}, not Llama's "
        "normalizer (Prepend ▁, spaces to ▁), which llama.cpp's llama tokenizer follows: it "
        "would tokenize leading spaces and text after special tokens otherwise",
        path=path,
    )


def _refuse_unscorable(model: dict[str, Any], added: set[int], path: Path) -> None:
    """llama.cpp merges the pair whose concatenation scores highest (``_scores``: by the first
    merge that makes it), which is transformers' BPE only where every piece of two or more
    characters is made by a merge and every split of it into two pieces is a merge (as
    transformers' converter of a sentencepiece model writes them); nor can it apply
    ignore_merges or dropout. Refused otherwise, naming the first piece that breaks it."""
    if model.get("dropout") or model.get("ignore_merges"):
        raise UnsupportedConversionError(
            "tokenizer.json's BPE sets dropout or ignore_merges, which llama.cpp's llama "
            "tokenizer does not apply",
            path=path,
        )
    vocab: dict[str, int] = model["vocab"]
    merges = set(_merge_pairs(model))
    made = {a + b for a, b in merges}
    for piece, i in vocab.items():
        if len(piece) < 2 or i in added or BYTE_TOKEN.fullmatch(piece):
            continue
        if piece not in made:
            why = "no merge makes it"
        else:
            splits = [(piece[:k], piece[k:]) for k in range(1, len(piece))]
            missing = [s for s in splits if s[0] in vocab and s[1] in vocab and s not in merges]
            if not missing:
                continue
            why = f"its split {' + '.join(missing[0])} is no merge"
        raise UnsupportedConversionError(
            f"tokenizer.json's piece {piece!r}: {why}, so llama.cpp's llama tokenizer, which "
            "merges by score, would split text otherwise than this BPE's merges",
            path=path,
        )


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
    llama = vocab.model == "llama"  # scores instead of merges, as llama.cpp's converter writes
    if llama:
        writer.add_token_scores(vocab.scores)
        writer.add_add_space_prefix(vocab.space_prefix)
    special = gguf.SpecialVocab(folder, load_merges=not llama, n_vocab=len(vocab.tokens))
    quiet = logging.getLogger("gguf.vocab")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # it logs each key it sets
    try:
        special.add_to_gguf(writer, quiet=True)
    finally:
        quiet.setLevel(level)
    kind = (
        f"sentencepiece-style BPE as llama.cpp's llama model, {len(vocab.tokens)} tokens "
        f"scored by their merges' ranks, space prefix {'on' if vocab.space_prefix else 'off'}"
        if llama
        else f"byte-level BPE, {len(vocab.tokens)} tokens, {len(special.merges)} merges, "
        f"pre-tokenizer {vocab.pre}"
    )
    notes = [
        f"vocabulary: {kind}, special ids {special.special_token_ids or 'none'}"
        + (", chat template" if special.chat_template else "")
    ]
    if vocab.padded:
        notes.append(
            f"{vocab.padded} ids the tokenizer leaves unused below vocab_size written as "
            "[PADn] tokens of type UNUSED (one token per embedding row)"
        )
    return notes
