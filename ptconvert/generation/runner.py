"""The greedy loop over a written artifact: what ``ptconvert.generate`` runs and what the check
compares with transformers. One ``Stepper`` per target (``targets.open_stepper``) feeds the
artifact the prompt once, then one token a step, and returns each step's last logits; ``greedy``
picks the tokens."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert.errors import UsageError
from ptconvert.generation.targets import Stepper, open_stepper


@dataclass
class Generated:
    """A greedy run: the prompt and the new tokens, each step's logits (batch × vocabulary),
    the seconds to the first new token and per token after it."""

    sequences: Any
    logits: list[Any] = field(default_factory=list)
    first_token_s: float = 0.0
    per_token_s: float = 0.0


def _prefix(stepper: Stepper, input_ids: Any) -> Any:
    """What the new tokens follow in the result: the prompt (a decoder-only LM), or the
    decoder's start token (a seq2seq stepper's ``prefix``, as ``generate`` returns it)."""
    prefix = getattr(stepper, "prefix", None)
    return prefix(input_ids) if prefix is not None else input_ids


def greedy(
    stepper: Stepper, input_ids: Any, max_new_tokens: int, eos_token_id: int | None = None
) -> Generated:
    """Greedy decoding over ``stepper``: the argmax of each step's logits, ``max_new_tokens``
    of them (fewer when every row has given ``eos_token_id``; a finished row repeats it)."""
    import torch

    if getattr(stepper, "input_rank", 2) == 3:  # a speech encoder's features: it checks them
        if input_ids.dim() != 3:
            raise UsageError(
                f"input_features is batch × mel bins × frames, got shape {list(input_ids.shape)}"
            )
    elif input_ids.dim() != 2 or input_ids.shape[1] < 1:
        raise UsageError(f"input_ids is batch × prompt length, got shape {list(input_ids.shape)}")
    if max_new_tokens < 1:
        raise UsageError(f"max_new_tokens is 1 or more, got {max_new_tokens}")
    began = time.perf_counter()
    with torch.no_grad():
        logits = stepper.start(input_ids, max_new_tokens)
        first = time.perf_counter() - began
        steps, chosen = [logits], [logits.argmax(-1)]
        done = chosen[-1] == eos_token_id if eos_token_id is not None else None
        while len(chosen) < max_new_tokens and not (done is not None and bool(done.all())):
            logits = stepper.step(chosen[-1][:, None])
            token = logits.argmax(-1)
            if done is not None:
                token = torch.where(done, torch.full_like(token, eos_token_id or 0), token)
                done = done | (token == eos_token_id)
            steps.append(logits)
            chosen.append(token)
    took = time.perf_counter() - began
    per_token = (took - first) / max(len(chosen) - 1, 1)
    prefix = _prefix(stepper, input_ids)
    sequences = torch.cat([prefix, torch.stack(chosen, 1).to(prefix.dtype)], 1)
    return Generated(sequences, steps, first, per_token)


def generate(
    artifact: str | Path,
    input_ids: Any,
    max_new_tokens: int = 16,
    *,
    eos_token_id: int | None = None,
    trust: bool = False,
) -> Generated:
    """Greedy generation with a generation export: ``max_new_tokens`` tokens after each row of
    ``input_ids`` (batch × prompt length, a tensor or nested lists), no padding. A seq2seq
    export's folder takes ``input_ids`` as the encoder's (a speech model's folder: its
    ``input_features``, float batch × mel bins × frames); its sequences are the decoder's (the
    start token, then the new ones), as transformers' ``generate`` returns them."""
    import torch

    ids = input_ids if isinstance(input_ids, torch.Tensor) else torch.tensor(input_ids)
    return greedy(open_stepper(artifact, trust), ids, max_new_tokens, eos_token_id)
