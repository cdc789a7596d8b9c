"""The check of a generation export: the artifact generates greedily (``runner.greedy``) at
batch 1 and 2 and two prompt lengths, and every token and every step's logits are compared with
transformers' ``generate(do_sample=False)`` on the eager model, at the tolerance of the project's
one table (``verify.parity.TOLERANCES``). A mismatch is a ``VerificationError`` (exit 6).

Two greedy runs part ways legitimately where the reference's two best logits are closer than the
tolerance (a tie): that row is compared up to the tie and no further, and the report says so."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ptconvert.errors import VerificationError
from ptconvert.generation.runner import greedy
from ptconvert.generation.static_cache import BATCHES
from ptconvert.generation.targets import Stepper
from ptconvert.report import Report

PROMPT_LENGTHS = (3, 7)
FEATURE_INPUTS = (1, 2)  # a speech model's: two different feature inputs (its frames are fixed)
NEW_TOKENS = 16


@dataclass
class RunResult(Report):
    batch: int
    prompt_length: int  # a speech model's: the feature input's number (FEATURE_INPUTS)
    new_tokens: int
    status: str  # pass | noise (within eager's fp64 error) | tie | fail_tokens | fail_logits
    max_abs_error: float = 0.0
    distinct_tokens: int = 0
    detail: str = ""


@dataclass
class GenerationCheck(Report):
    status: str  # pass | fail
    tolerance: float
    runs: list[RunResult] = field(default_factory=list)
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


def _noise(ours: Any, theirs: Any, gold: Any, tolerance: float) -> bool:
    """Outside allclose but no further from the float64 truth than eager is (parity's rule:
    RMSE against fp64 at most 2× eager's, 3× for fewer than 1000 values, plus tol/10)."""

    def rmse(x: Any) -> float:
        return float(((x.double() - gold.double()) ** 2).mean().sqrt())

    multiplier = 3.0 if ours.numel() < 1000 else 2.0
    return rmse(ours) <= multiplier * rmse(theirs) + tolerance / 10


def compare_run(
    mine: Any,
    reference: Any,
    prompt_length: int,
    batch: int,
    tolerance: float,
    gold: Any = None,
) -> RunResult:
    """One greedy run against transformers': tokens row by row, logits step by step. A step's
    logits outside allclose pass when ``gold()`` (the float64 logits per step, or None) says
    they are as close to the truth as eager's."""
    import torch

    truth: list[Any] | None = None

    got = mine.sequences[:, -len(mine.logits) :]  # the new tokens of each
    want = reference.sequences[:, -len(reference.logits) :]
    steps = min(len(mine.logits), len(reference.logits))
    worst, status, detail = 0.0, "pass", ""
    for row in range(batch):
        for k in range(steps):
            ours, theirs = mine.logits[k][row].float(), reference.logits[k][row].float()
            error = float((ours - theirs).abs().max())
            worst = max(worst, error)
            if not torch.allclose(ours, theirs, atol=tolerance, rtol=tolerance):
                if truth is None and gold is not None:
                    truth = gold() or []
                if truth and _noise(ours, theirs, truth[k][row], tolerance):
                    status = "noise" if status == "pass" else status
                    continue
                return RunResult(
                    batch, prompt_length, steps, "fail_logits", worst, _distinct(got),
                    f"row {row}, new token {k}: logits differ by up to {error:.3g} "
                    f"(tolerance {tolerance:g})",
                )  # fmt: skip
            if int(got[row, k]) != int(want[row, k]):
                best = float(theirs.max())
                if float(theirs[int(got[row, k])]) >= best - tolerance * (1 + abs(best)):
                    status = "tie"
                    detail = (
                        f"row {row}, new token {k}: {int(got[row, k])} and transformers' "
                        f"{int(want[row, k])} tie within the tolerance; compared up to there"
                    )
                    break
                return RunResult(
                    batch, prompt_length, steps, "fail_tokens", worst, _distinct(got),
                    f"row {row}, new token {k}: {int(got[row, k])}, transformers chose "
                    f"{int(want[row, k])}",
                )  # fmt: skip
    return RunResult(batch, prompt_length, steps, status, worst, _distinct(got), detail)


def _distinct(tokens: Any) -> int:
    return len(set(tokens.flatten().tolist()))


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

            runs.append(compare_run(mine, reference, length, batch, tolerance, gold))
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
