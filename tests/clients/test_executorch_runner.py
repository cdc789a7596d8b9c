"""ExecuTorch's own LLM runner (``TextLLMRunner`` of the executorch wheel in ``.venv``, run by
llm_runner_client.py in a process of its own) on the default LLM program
(``--to pte --task text-generation-with-past``), against transformers' greedy tokens here.

The runner reads a tokenizer file; the tiny Llama has none, so the test writes one
(``write_tokenizer``: one character a token), which makes a prompt of ids a string and each
piece the runner gives back an id."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import ptconvert
from tests.clients.conftest import run_client
from tests.generation.conftest import FIRST, build, eager, reference, write_tokenizer

pytestmark = pytest.mark.clients


def test_default_llm_pte_generates_in_text_llm_runner(tmp_path: Path) -> None:
    pytest.importorskip("executorch.extension.llm.runner")
    source = build("llama", tmp_path)
    out = tmp_path / "llama.pte"
    ptconvert.convert(source, "pte", out, task="text-generation-with-past")
    tokenizer = write_tokenizer(tmp_path / "tokenizer.json")
    ids = torch.randint(3, 98, (1, 5), generator=torch.Generator().manual_seed(1))
    new_tokens = 12
    want = reference(eager(source), ids, new_tokens).sequences[0, 5:].tolist()
    assert 2 not in want  # the config's eos, where the runner would stop
    assert len(set(want)) > 3
    prompt = "".join(chr(FIRST + i) for i in ids[0].tolist())
    script = Path(__file__).with_name("llm_runner_client.py")
    command = [sys.executable, script, out, tokenizer]
    # the default program has one row, as the runner feeds it (issue 40: a cache of 2 rows
    # failed there, aten::expand_copy.out: expanded size 4 vs existing 2)
    pieces = run_client(command, {"prompt": prompt, "new_tokens": new_tokens}, tmp_path, "et")
    assert [ord(p) - FIRST for p in pieces] == want
