"""Decoder-only LMs to an AOTInductor package with a static cache: converted (the check generates
with it), then generated with by a loop of the test's own over ``aoti_load_package`` (not
ptconvert's runner), token for token against transformers' ``generate``. The cache lives in
buffers the compiled code mutates: one runner keeps it between calls. Compiles take ~20–60 s."""

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
pytestmark = pytest.mark.slow


def own_loop(runner: Any, ids: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, list[Any]]:
    """Greedy decoding over one loaded package: the prompt at positions 0…n-1 (a new sequence:
    the wrapper resets the cache's lengths from cache_position), then one token per call at its
    position; the package's batch is 2: batch 1 is padded."""
    rows, prompt = ids.shape

    def pad(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x[-1:].expand(2 - rows, x.shape[1])]) if rows < 2 else x

    logits = runner(input_ids=pad(ids), cache_position=torch.arange(prompt))[:rows, -1]
    steps, tokens = [logits], [logits.argmax(-1)]
    for k in range(new_tokens - 1):
        step = pad(tokens[-1][:, None].contiguous())
        logits = runner(input_ids=step, cache_position=torch.tensor([prompt + k]))[:rows, -1]
        steps.append(logits)
        tokens.append(logits.argmax(-1))
    return torch.stack(tokens, 1), steps


@pytest.fixture(scope="module")
def converted(tiny: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("aoti") / "gpt2.aoti.pt2"
    return ptconvert.convert(tiny["gpt2"], "aoti", out, task=TASK)


@pytest.fixture(scope="module")
def gpt2_aoti(converted: Any) -> Path:
    return Path(converted.output)


def test_package_generates_as_transformers_with_one_runner(
    tiny: dict[str, Path], gpt2_aoti: Path
) -> None:
    from torch._inductor import aoti_load_package

    model = eager(tiny["gpt2"])
    runner = aoti_load_package(str(gpt2_aoti))  # one runner: its cache carries every run
    distinct: set[int] = set()
    with torch.no_grad():
        for rows in (1, 2):
            for prompt in (4, 9):
                ids = torch.randint(
                    3, 99, (rows, prompt), generator=torch.Generator().manual_seed(7)
                )
                want = reference(model, ids)
                got, logits = own_loop(runner, ids, 16)
                assert torch.equal(got, want.sequences[:, prompt:]), (rows, prompt)
                for ours, theirs in zip(logits, want.logits, strict=True):
                    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
                distinct |= set(got.flatten().tolist())
        assert len(distinct) > 3  # the tiny model does not repeat one token: the test can fail
        # the state is the runner's: a fresh runner given only a step has no prompt behind it
        ids = torch.randint(3, 99, (2, 4), generator=torch.Generator().manual_seed(7))
        _, steps = own_loop(runner, ids, 2)
        fresh = aoti_load_package(str(gpt2_aoti))
        alone = fresh(input_ids=steps[0].argmax(-1)[:, None].contiguous(),
                      cache_position=torch.tensor([4]))[:, -1]  # fmt: skip
        assert not torch.allclose(alone, steps[1], atol=1e-3)


def test_runner_info_and_report(
    tiny: dict[str, Path], converted: Any, gpt2_aoti: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert converted.check == "generation" and converted.generation.check.status == "pass"
    assert converted.generation.cache == {"kind": "static", "batch_size": 2, "length": 64}
    assert any("AOTInductor compiled for cpu" in n for n in converted.notes)
    assert {(r.batch, r.prompt_length) for r in converted.generation.check.runs} >= {(1, 3), (2, 7)}
    with zipfile.ZipFile(gpt2_aoti) as archive:
        name = next(n for n in archive.namelist() if n.endswith("/generation.json"))
        meta = json.loads(archive.read(name))
    assert meta["task"] == TASK and meta["batch_size"] == 2 and meta["cache_length"] == 64
    info = ptconvert.describe(gpt2_aoti)
    assert info.format == "aoti"
    assert info.metadata["cache"] == "static, batch 2, 64 positions"
    # ptconvert.generate: the same greedy loop, native code loaded only with trust
    ids = torch.randint(3, 99, (1, 5), generator=torch.Generator().manual_seed(3))
    with pytest.raises(ptconvert.PtconvertError):
        ptconvert.generate(gpt2_aoti, ids, max_new_tokens=4)
    out = ptconvert.generate(gpt2_aoti, ids, max_new_tokens=16, trust=True)
    want = reference(eager(tiny["gpt2"]), ids)
    assert torch.equal(out.sequences, want.sequences)
    plan = main(["plan", str(tiny["gpt2"]), "--to", "aoti", "--task", TASK])
    assert plan == 0 and "static cache, batch 2" in capsys.readouterr().out
