"""Decoder-only LMs to pt2 with a static cache: converted, then generated with by a loop of the
test's own over ``torch.export.load`` (not ptconvert's runner), token for token and logit for
logit against transformers' ``generate``."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

import ptconvert
from ptconvert.cli import main
from tests.generation.conftest import eager, reference

TASK = "text-generation-with-past"


def own_loop(path: Path, ids: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, list[Any]]:
    """Greedy decoding over the program as torch loads it: the prompt in one call, then one
    token per call at its cache position (the program's batch is 2: batch 1 is padded)."""
    program = torch.export.load(path).module()
    rows, prompt = ids.shape
    padded = torch.cat([ids, ids[-1:].expand(2 - rows, prompt)]) if rows < 2 else ids
    logits = program(input_ids=padded, cache_position=torch.arange(prompt))[:rows, -1]
    steps, tokens = [logits], [logits.argmax(-1)]
    for k in range(new_tokens - 1):
        step = tokens[-1][:, None]
        step = torch.cat([step, step[-1:].expand(2 - rows, 1)]) if rows < 2 else step
        logits = program(input_ids=step, cache_position=torch.tensor([prompt + k]))[:rows, -1]
        steps.append(logits)
        tokens.append(logits.argmax(-1))
    return torch.stack(tokens, 1), steps


def assert_generates_as_transformers(directory: Path, artifact: Path) -> None:
    model = eager(directory)
    distinct: set[int] = set()
    for rows in (1, 2):
        for prompt in (4, 9):
            ids = torch.randint(3, 99, (rows, prompt), generator=torch.Generator().manual_seed(7))
            want = reference(model, ids)
            got, logits = own_loop(artifact, ids, 16)
            assert torch.equal(got, want.sequences[:, prompt:]), (rows, prompt)
            for ours, theirs in zip(logits, want.logits, strict=True):
                torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
            distinct |= set(got.flatten().tolist())
    assert len(distinct) > 3  # the tiny model does not repeat one token: the test can fail


@pytest.fixture(scope="module")
def llama_pt2(tiny: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pt2") / "llama.pt2"
    code = main([str(tiny["llama"]), "--to", "pt2", "--task", TASK, "-o", str(out), "-q"])
    assert code == 0
    return out


def test_cli_writes_a_static_cache_program_that_generates(
    tiny: dict[str, Path], llama_pt2: Path
) -> None:
    assert_generates_as_transformers(tiny["llama"], llama_pt2)
    with zipfile.ZipFile(llama_pt2) as archive:  # what the runner and info read
        name = next(n for n in archive.namelist() if n.endswith("/generation.json"))
        meta = json.loads(archive.read(name))
    assert meta["task"] == TASK and meta["batch_size"] == 2 and meta["cache_length"] == 64
    info = ptconvert.describe(llama_pt2)
    assert info.metadata["task"] == TASK
    assert info.metadata["cache"] == "static, batch 2, 64 positions"


def test_the_report_says_the_cache_and_the_check(
    tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gpt2.pt2"
    code = main([str(tiny["gpt2"]), "--to", "pt2", "--task", TASK, "-o", str(out), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["generation"]["cache"] == {"kind": "static", "batch_size": 2, "length": 64}
    assert report["check"] == "generation" and report["generation"]["check"]["status"] == "pass"
    runs = {(r["batch"], r["prompt_length"]): r for r in report["generation"]["check"]["runs"]}
    assert set(runs) == {(1, 3), (1, 7), (2, 3), (2, 7)}
    assert all(r["new_tokens"] == 16 and r["status"] == "pass" for r in runs.values())
    assert_generates_as_transformers(tiny["gpt2"], out)
    # GPT-2 ties lm_head to the token embedding: its 99 × 32 floats are stored once
    with zipfile.ZipFile(out) as archive:
        sizes = [i.file_size for i in archive.infolist() if "/data/weights/" in i.filename]
    assert sizes.count(99 * 32 * 4) == 1


@pytest.mark.slow
def test_qwen2_generates_as_transformers(tiny: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "qwen2.pt2"
    report = ptconvert.convert(tiny["qwen2"], "pt2", out, task=TASK)
    assert report.check == "generation"
    assert_generates_as_transformers(tiny["qwen2"], out)


def test_generate_is_the_public_runner(tiny: dict[str, Path], llama_pt2: Path) -> None:
    ids = torch.randint(3, 99, (1, 5), generator=torch.Generator().manual_seed(3))
    result = ptconvert.generate(llama_pt2, ids, max_new_tokens=16)
    want = reference(eager(tiny["llama"]), ids)
    assert torch.equal(result.sequences, want.sequences)
    assert len(result.logits) == 16 and result.per_token_s > 0
    nested = ptconvert.generate(llama_pt2, ids.tolist(), max_new_tokens=4)  # lists work too
    assert torch.equal(nested.sequences, want.sequences[:, :9])


def test_the_runner_says_what_does_not_fit(llama_pt2: Path) -> None:
    with pytest.raises(ptconvert.UsageError, match="static cache holds 2 row"):
        ptconvert.generate(llama_pt2, torch.ones((3, 4), dtype=torch.long))
    with pytest.raises(ptconvert.UsageError, match="do not fit the program's static cache of 64"):
        ptconvert.generate(llama_pt2, torch.ones((1, 60), dtype=torch.long), max_new_tokens=16)


def test_plan_and_info_show_the_task(
    tiny: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", str(tiny["llama"]), "--to", "pt2", "--task", TASK]) == 0
    shown = capsys.readouterr().out
    assert "text-generation-with-past" in shown and "static cache, batch 2" in shown
    assert ptconvert.describe(tiny["llama"]).metadata["tasks"] == (
        "text-generation, text-generation-with-past"
    )
    assert ptconvert.describe(tiny["bert"]).metadata["tasks"] == "feature-extraction"


def test_a_task_that_does_not_fit_is_said(
    tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "x.pt2")
    assert main([str(tiny["bert"]), "--to", "pt2", "--task", TASK, "-o", out]) == 4
    assert "BertModel" in capsys.readouterr().err
    assert main([str(tiny["llama"]), "--to", "torchscript", "--task", TASK, "-o", out]) == 2
    assert "--to pt2 or aoti or onnx or pte" in capsys.readouterr().err
    assert not Path(out).exists()
