"""What a check in a client's own LLM runner shares with every such client (a target's
``client_check``, ``targets.Target``): the prompt text, transformers' greedy tokens for it, and
the comparison of the pieces the runner printed with those tokens.

A runner takes text, not ids: the prompt is tokenized here with the source's own
``tokenizer.json`` (``tokenizers``), without special tokens, as the runner is asked to (no BOS,
no EOS); transformers generates greedily from those ids, and each of its tokens is decoded to
compare with the runner's piece. The runner stops after the end-of-sequence id it reaches (its
piece given first), except on the prompt's first token (the prefill's, emitted unchecked)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptconvert.errors import VerificationError

TOKENIZER_FILE = "tokenizer.json"
ENGLISH = "Once upon a time"


def load_tokenizer(path: Path) -> Any:
    """The ``tokenizers`` Tokenizer of a ``tokenizer.json``."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def prompt_text(tokenizer: Any, vocab: int, seed: int) -> tuple[str, list[int]]:
    """A prompt and its ids (no special tokens): English where the tokenizer writes it back as
    it was, else (a test's tokenizer of made-up characters) the text of random ids of its
    vocabulary, as ``check.prompts`` draws them. No ids: ("", [])."""
    from ptconvert.generation.check import PROMPT_LENGTHS, prompts

    ids = tokenizer.encode(ENGLISH, add_special_tokens=False).ids
    if ids and tokenizer.decode(ids) == ENGLISH:
        return ENGLISH, list(ids)
    size = min(vocab, tokenizer.get_vocab_size())
    drawn = prompts(size, 1, PROMPT_LENGTHS[-1], seed)[0].tolist()
    text = "".join(tokenizer.decode([i]) for i in drawn)  # special tokens decode to nothing
    return (text, list(tokenizer.encode(text, add_special_tokens=False).ids)) if text else ("", [])


def expected_tokens(
    model: Any, ids: Sequence[int], new_tokens: int, eos: Sequence[int]
) -> list[int]:
    """transformers' greedy tokens after ``ids`` (``check.reference_generate``), cut after the
    first of the ``eos`` ids past the first token, where a runner stops."""
    import torch

    from ptconvert.generation.check import reference_generate

    prompt = torch.tensor([list(ids)])
    out = reference_generate(model, prompt, new_tokens, attention_mask=torch.ones_like(prompt))
    tokens: list[int] = out.sequences[0, len(ids) :].tolist()
    ends = set(eos)
    stop = next((k for k in range(1, len(tokens)) if tokens[k] in ends), len(tokens) - 1)
    return tokens[: stop + 1]


def compare_pieces(
    runner: str,
    pieces: Sequence[str],
    tokens: Sequence[int],
    tokenizer: Any,
    prompt: str,
    *,
    may_stop_early: bool,
    path: Any = None,
) -> None:
    """The runner's pieces against transformers' ``tokens``, one by one: a piece is the token's
    text alone or as it continues the tokens before it (a decoder that strips a leading space
    decodes one token without it). ``may_stop_early``: the runner's end-of-sequence ids are not
    known here (its tokenizer's), so fewer pieces pass. A difference: ``VerificationError``
    naming the runner, the prompt and the first differing token."""
    for k, piece in enumerate(pieces):
        if k >= len(tokens):
            raise VerificationError(
                f"{runner} generates differently from transformers for the prompt {prompt!r}: "
                f"new token {k}: {piece!r} where transformers stopped after {len(tokens)}",
                path=path,
            )
        if piece not in _texts(tokenizer, tokens, k):
            want = tokenizer.decode([tokens[k]], skip_special_tokens=False)
            raise VerificationError(
                f"{runner} generates differently from transformers for the prompt {prompt!r}: "
                f"new token {k}: {piece!r}, transformers chose {tokens[k]} ({want!r})",
                path=path,
            )
    if len(pieces) < len(tokens) and not may_stop_early:
        raise VerificationError(
            f"{runner} generates differently from transformers for the prompt {prompt!r}: it "
            f"stopped after {len(pieces)} tokens, transformers generated {len(tokens)}",
            path=path,
        )


def _texts(tokenizer: Any, tokens: Sequence[int], k: int) -> set[str]:
    """Token ``k``'s text alone, and as it continues tokens ``0..k-1``."""
    alone = tokenizer.decode([tokens[k]], skip_special_tokens=False)
    before = tokenizer.decode(list(tokens[:k]), skip_special_tokens=False)
    after = tokenizer.decode(list(tokens[: k + 1]), skip_special_tokens=False)
    return {alone, after[len(before) :] if after.startswith(before) else alone}
