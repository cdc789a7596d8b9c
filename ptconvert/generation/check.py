"""The check of a generation export: the artifact generates greedily (``runner.greedy``) at
batch 1 and 2 and two prompt lengths, and every token and every step's logits are compared with
transformers' ``generate(do_sample=False)`` on the eager model, at the tolerance of the project's
one table (``verify.parity.TOLERANCES``). A mismatch is a ``VerificationError`` (exit 6).

Two greedy runs part ways legitimately where the reference's two best logits are closer than the
tolerance (a tie): that row is compared up to the tie and no further, and the report says so.
How one run is judged against transformers' is ``verify.judging.judge_generation``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ptconvert.errors import VerificationError
from ptconvert.generation.runner import greedy
from ptconvert.generation.static_cache import BATCHES
from ptconvert.generation.targets import Stepper
from ptconvert.report import Report
from ptconvert.verify.judging import GenerationRun, judge_generation

PROMPT_LENGTHS = (3, 7)
FEATURE_INPUTS = (1, 2)  # a speech model's: two different feature inputs (its frames are fixed)
NEW_TOKENS = 16


@dataclass
class GenerationCheck(Report):
    status: str  # pass | fail
    tolerance: float
    runs: list[GenerationRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def reference_generate(model: Any, input_ids: Any, new_tokens: int, **inputs: Any) -> Any:
    """transformers' greedy ``generate`` on the eager model: exactly ``new_tokens`` tokens (no
    end-of-sequence stop, no logits processor), with each step's raw logits. ``input_ids`` is
    the model's main input: a speech model's ``input_features``, whose ``generate`` (Whisper's)
    given this bare config forces no decoder ids, predicts no timestamps and suppresses no
    tokens: the same plain greedy loop."""
    import torch
    from transformers import GenerationConfig

    start = getattr(model.generation_config, "decoder_start_token_id", None)
    config = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=new_tokens,
        min_new_tokens=None,
        eos_token_id=None,
        pad_token_id=0,
        decoder_start_token_id=start,
        output_logits=True,
        return_dict_in_generate=True,
    )
    # generate fills what the passed config leaves unset (None) from the model's own: BART's
    # forced_eos_token_id would force its end token at the last step. The model's config is
    # swapped for a bare one while it runs.
    saved = model.generation_config
    model.generation_config = GenerationConfig(decoder_start_token_id=start)
    try:
        with torch.no_grad():
            return model.generate(input_ids, generation_config=config, **inputs)
    finally:
        model.generation_config = saved


def prompts(vocab: int, batch: int, length: int, seed: int) -> Any:
    import torch

    generator = torch.Generator().manual_seed(seed * 1000 + batch * 10 + length)
    low = 3 if vocab > 8 else 0  # past the usual special ids
    return torch.randint(low, vocab, (batch, length), generator=generator)


def features(shape: Any, batch: int, which: int, seed: int) -> Any:
    """A speech model's input: ``batch`` random log-mel-like features of ``shape`` (mel bins ×
    frames), a different draw for each ``which``."""
    import torch

    generator = torch.Generator().manual_seed(seed * 1000 + batch * 10 + which)
    return torch.randn((batch, *shape), generator=generator)


def gold_logits(model: Any, input_ids: Any, reference: Any, **inputs: Any) -> list[Any] | None:
    """Each step's logits of the model's float64 copy (``parity.fp64_model``), fed the
    reference's tokens (no cache): the ground truth that tells precision noise from a broken
    export. None where no float64 copy can be made."""
    import torch

    from ptconvert.verify.parity import fp64_model

    gold = fp64_model(model)
    if gold is None:
        return None
    steps = len(reference.logits)
    sequences = reference.sequences
    if input_ids.is_floating_point():  # a speech model's features, in the copy's precision
        input_ids = input_ids.double()
    with torch.no_grad():
        if getattr(model.config, "is_encoder_decoder", False):
            main = getattr(model, "main_input_name", "input_ids")
            out = gold(**{main: input_ids}, decoder_input_ids=sequences[:, :-1],
                       use_cache=False, **inputs)  # fmt: skip
        else:
            out = gold(input_ids=sequences[:, :-1], use_cache=False)
    logits = out.logits[:, -steps:]
    return [logits[:, k] for k in range(steps)]


def check_generation(
    model: Any,
    stepper: Stepper,
    *,
    make_inputs: Any,
    batches: Sequence[int] = BATCHES,
    prompt_lengths: Sequence[int] = PROMPT_LENGTHS,
    new_tokens: int = NEW_TOKENS,
    path: Any = None,
    prompt_label: str = "prompt length",
) -> GenerationCheck:
    """Generate with ``stepper`` and with transformers at every batch and prompt length and
    compare; ``make_inputs(batch, length)`` gives (input_ids for the stepper, keywords for
    ``generate``). A speech model's ``prompt_lengths`` number its feature inputs
    (``prompt_label`` "feature input"). Raises ``VerificationError`` on a mismatch."""
    from ptconvert.verify.parity import TOLERANCES

    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    tolerance = TOLERANCES.get(dtype, TOLERANCES["float32"])
    runs = []
    for batch in batches:
        for length in prompt_lengths:
            ids, keywords = make_inputs(batch, length)
            reference = reference_generate(model, ids, new_tokens, **keywords)
            mine = greedy(stepper, ids, new_tokens)

            def gold(ids: Any = ids, reference: Any = reference, keywords: Any = keywords) -> Any:
                return gold_logits(model, ids, reference, **keywords)

            runs.append(judge_generation(mine, reference, length, batch, tolerance, gold))
    check = GenerationCheck("pass", tolerance, runs)
    failed = [r for r in runs if r.status.startswith("fail")]
    if failed:
        check.status = "fail"
        first = failed[0]
        raise VerificationError(
            f"generating with the artifact differs from transformers' generate at batch "
            f"{first.batch}, {prompt_label} {first.prompt_length}: {first.detail}",
            path=path,
        )
    if max(r.distinct_tokens for r in runs) <= 1:
        check.notes.append(
            "the model gives one token over and over: the check rests on each step's logits"
        )
    check.notes.extend(r.detail for r in runs if r.status == "tie")
    if any(r.status == "noise" for r in runs):
        check.notes.append(
            "some steps' logits are outside allclose but as close to the model's float64 "
            "logits as eager's (parity's fp64 rule): precision noise, passed"
        )
    return check
