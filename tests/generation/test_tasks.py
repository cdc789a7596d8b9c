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


def test_targets_a_task_does_not_write_and_a_task_of_another_kind_are_said(
    tiny_whisper: Path, tmp_path: Path
) -> None:
    import ptconvert

    with pytest.raises(UsageError, match="writes --to pt2 or onnx, not aoti"):
        ptconvert.convert(
            tiny_whisper, "aoti", tmp_path / "w", task="automatic-speech-recognition-with-past"
        )
    with pytest.raises(ptconvert.UnsupportedConversionError, match="speech-seq2seq") as caught:
        ptconvert.convert(
            tiny_whisper, "pt2", tmp_path / "w", task="text2text-generation-with-past"
        )
    assert "automatic-speech-recognition-with-past" in str(caught.value.hint)
    assert not (tmp_path / "w").exists()


def test_the_targets_a_task_accepts_are_those_the_formats_declare(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The targets a task accepts (said before the model loads) are the generation targets the
    target packages declare (``Format.generation_targets``): a decoder's as one file, a seq2seq
    model's as a folder; a format that declares none is no target of any task."""
    from ptconvert.formats import FORMATS_BY_NAME
    from ptconvert.generation.tasks import target_names

    assert target_names("decoder") == ["pt2", "aoti", "onnx", "pte"]
    assert target_names("seq2seq") == target_names("speech-seq2seq") == ["pt2", "onnx"]
    monkeypatch.setattr(FORMATS_BY_NAME["pte"], "generation_targets", lambda: [])
    assert target_names("decoder") == ["pt2", "aoti", "onnx"]
