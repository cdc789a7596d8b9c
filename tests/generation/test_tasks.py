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

    whisper = tmp_path / "whisper"
    config = t.WhisperConfig(
        vocab_size=99, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, num_mel_bins=8,
        max_source_positions=8, max_target_positions=16, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=3,
    )  # fmt: skip
    t.WhisperForConditionalGeneration(config).save_pretrained(whisper)
    with pytest.raises(UsageError, match="writes no target yet"):
        ptconvert.convert(
            whisper, "pt2", tmp_path / "w", task="automatic-speech-recognition-with-past"
        )
