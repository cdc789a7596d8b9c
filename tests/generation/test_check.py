"""The generation check fails when the artifact generates anything else: a stepper that is
the eager model itself passes; one whose logits drift at one step, or that picks another token,
is a VerificationError (exit 6)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from ptconvert.errors import VerificationError
from ptconvert.generation.check import check_generation, prompts
from tests.generation.conftest import eager


class EagerStepper:
    """The eager model recomputing the whole sequence each step (no cache); ``drift`` is added
    to the logits from new token ``at`` on."""

    def __init__(self, model: Any, at: int = -1, drift: float = 0.0) -> None:
        self.model, self.at, self.drift = model, at, drift
        self.ids: Any = None

    def _last(self) -> Any:
        logits = self.model(input_ids=self.ids, use_cache=False).logits[:, -1]
        made = len(self.ids[0]) - self.prompt
        return logits + self.drift if made >= self.at >= 0 else logits

    def start(self, input_ids: Any, max_new_tokens: int) -> Any:
        self.ids, self.prompt = input_ids, input_ids.shape[1]
        return self._last()

    def step(self, tokens: Any) -> Any:
        self.ids = torch.cat([self.ids, tokens], 1)
        return self._last()


def make_inputs(batch: int, length: int) -> tuple[Any, dict[str, Any]]:
    ids = prompts(99, batch, length, 0)
    return ids, {"attention_mask": torch.ones_like(ids)}


def test_the_eager_model_passes(tiny: dict[str, Path]) -> None:
    model = eager(tiny["llama"])
    check = check_generation(model, EagerStepper(model), make_inputs=make_inputs)
    assert check.status == "pass" and len(check.runs) == 4
    assert all(r.distinct_tokens > 3 for r in check.runs)


def test_logits_that_drift_fail(tiny: dict[str, Path]) -> None:
    model = eager(tiny["llama"])
    with pytest.raises(VerificationError, match="new token 5: logits differ") as caught:
        check_generation(model, EagerStepper(model, at=5, drift=1e-2), make_inputs=make_inputs)
    assert caught.value.exit_code == 6


def test_another_token_fails(tiny: dict[str, Path]) -> None:
    model = eager(tiny["llama"])

    class Swapped(EagerStepper):
        def _last(self) -> Any:  # the same logits but for two tokens swapped at step 2
            logits = super()._last()
            if len(self.ids[0]) - self.prompt == 2:
                top = logits.argmax(-1)
                logits = logits.clone()
                logits[:, 0], logits[torch.arange(len(top)), top] = logits[0, top[0]], 0.0
            return logits

    with pytest.raises(VerificationError, match="batch 1, prompt length 3"):
        check_generation(model, Swapped(model), make_inputs=make_inputs)
