"""--task takes optimum's task names beside transformers class names."""

from __future__ import annotations

from pathlib import Path

import pytest

from ptconvert.errors import UsageError
from ptconvert.model.spec import module_from_hf


def test_a_task_name_loads_its_auto_class(tiny: dict[str, Path]) -> None:
    assert type(module_from_hf(tiny["gpt2"], "text-generation", {}).model).__name__ == (
        "GPT2LMHeadModel"
    )
    assert type(module_from_hf(tiny["gpt2"], "feature-extraction", {}).model).__name__ == (
        "GPT2Model"
    )
    assert type(module_from_hf(tiny["gpt2"], "GPT2Model", {}).model).__name__ == "GPT2Model"


def test_unknown_and_generation_tasks_outside_their_export_are_usage_errors(
    tiny: dict[str, Path],
) -> None:
    with pytest.raises(UsageError, match="nor a task ptconvert knows"):
        module_from_hf(tiny["gpt2"], "text-generation-with-cake", {})
    with pytest.raises(UsageError, match="is a generation export"):
        module_from_hf(tiny["gpt2"], "text-generation-with-past", {})


def test_tasks_not_written_yet_are_said(tmp_path: Path) -> None:
    import transformers as t

    import ptconvert

    t5 = tmp_path / "t5"
    t.T5ForConditionalGeneration(
        t.T5Config(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=1, num_heads=4)
    ).save_pretrained(t5)
    with pytest.raises(UsageError, match="writes no target yet"):
        ptconvert.convert(t5, "pt2", tmp_path / "t5.pt2", task="text2text-generation-with-past")
