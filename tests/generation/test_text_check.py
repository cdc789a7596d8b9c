"""The check in a client's own LLM runner, its shared parts (``generation/text_check.py``) and
the .pte's hook where it cannot run: the pieces a runner printed against transformers' tokens,
the prompt a tokenizer gives, and the one note that says why the runner did not run. The
conversions that run ExecuTorch's TextLLMRunner are in tests/convert/test_pte.py (slow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ptconvert.errors import VerificationError
from ptconvert.generation import text_check
from ptconvert.options import Options
from tests.generation.conftest import FIRST, write_tokenizer


@pytest.fixture
def tokenizer(tmp_path: Path):  # type: ignore[no-untyped-def]
    return text_check.load_tokenizer(write_tokenizer(tmp_path / "tokenizer.json"))


def test_the_same_pieces_pass_and_the_first_difference_is_named(tokenizer) -> None:  # type: ignore[no-untyped-def]
    tokens = [5, 17, 42, 8]
    pieces = [chr(FIRST + t) for t in tokens]
    text_check.compare_pieces("Runner", pieces, tokens, tokenizer, "ab", may_stop_early=False)
    pieces[2] = chr(FIRST + 43)
    with pytest.raises(VerificationError) as caught:
        text_check.compare_pieces("Runner", pieces, tokens, tokenizer, "ab", may_stop_early=False)
    message = caught.value.message
    assert "Runner" in message and "'ab'" in message and "new token 2" in message, message
    assert "transformers chose 42" in message, message


def test_a_runner_that_stops_early_or_runs_on_differs(tokenizer) -> None:  # type: ignore[no-untyped-def]
    tokens = [5, 17, 42]
    pieces = [chr(FIRST + t) for t in tokens]
    with pytest.raises(VerificationError, match="stopped after 2 tokens"):
        text_check.compare_pieces("R", pieces[:2], tokens, tokenizer, "p", may_stop_early=False)
    # its end-of-sequence ids unknown here (its tokenizer's): fewer pieces pass
    text_check.compare_pieces("R", pieces[:2], tokens, tokenizer, "p", may_stop_early=True)
    with pytest.raises(VerificationError, match="new token 3"):
        text_check.compare_pieces("R", [*pieces, "x"], tokens, tokenizer, "p", may_stop_early=True)


def test_a_tokenizer_without_english_gives_a_prompt_of_its_own_characters(tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompt, ids = text_check.prompt_text(tokenizer, 99, seed=0)
    assert ids and prompt == "".join(chr(FIRST + i) for i in ids)


def test_the_pte_check_says_why_the_runner_did_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No tokenizer.json, or a wheel without the runner: one note says so (nothing run)."""
    from ptconvert.formats.pte import generation, llm_runner

    program = tmp_path / "m.pte"  # never read: the note comes first
    note = generation.client_check(None, program, tmp_path, Options())
    assert note == "not run in ExecuTorch's TextLLMRunner: the directory has no tokenizer.json"
    write_tokenizer(tmp_path / "tokenizer.json")
    monkeypatch.setattr(llm_runner, "runner_installed", lambda: False)
    note = generation.client_check(None, program, tmp_path, Options())
    assert note.startswith("not run in ExecuTorch's TextLLMRunner: the executorch wheel has no")
