"""``ptconvert bench`` on a generation export: time to the first token and per token of the
artifact, transformers' eager ``generate`` and its ``torch.compile``d decoding, in one run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ptconvert
from ptconvert.cli import main

TASK = "text-generation-with-past"


@pytest.fixture(scope="module")
def gpt2_pt2(tiny: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "gpt2.pt2"
    ptconvert.convert(tiny["gpt2"], "pt2", out, task=TASK, verify=False)
    return out


@pytest.mark.slow  # torch.compile (inductor); the next test times without it
def test_bench_times_tokens_against_eager_and_compile(
    tiny: dict[str, Path], gpt2_pt2: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", str(gpt2_pt2), "--reference", str(tiny["gpt2"]), "--json"]
    args += ["--batch-sizes", "1", "--new-tokens", "4", "--prompt-length", "5"]
    code = main([*args, "--repeats", "2", "--warmup", "1", "--threads", "1"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["mode"] == "generation" and report["task"] == TASK
    assert (report["new_tokens"], report["prompt_length"]) == (4, 5)
    assert report["skipped"] == {}
    tokens = {t["runtime"]: t for t in report["tokens"]}
    assert set(tokens) == {"artifact", "eager", "torch.compile"}
    for t in tokens.values():
        assert t["batch"] == 1 and t["samples"] == 2
        assert t["first_token_ms"] > 0 and t["per_token_ms"] > 0
        assert t["per_token_p25_ms"] <= t["per_token_ms"] <= t["per_token_p75_ms"]
    (ratios,) = report["ratios"]
    assert ratios["batch"] == 1
    for other in ("eager", "torch.compile"):  # the reference's median over the artifact's
        want = tokens[other]["per_token_ms"] / tokens["artifact"]["per_token_ms"]
        assert ratios[f"per_token_vs_{other}"] == pytest.approx(want, rel=1e-2)
        assert ratios[f"first_token_vs_{other}"] > 0
    # the cache has 2 rows: batch 1 runs padded, and the report says so
    assert any("padded" in note for note in report["notes"])


def test_bench_caps_the_batch_at_the_static_cache(
    tiny: dict[str, Path], gpt2_pt2: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", str(gpt2_pt2), "--reference", str(tiny["gpt2"]), "--compile-mode", "none"]
    args += ["--new-tokens", "3", "--prompt-length", "3", "--repeats", "1", "--warmup", "0"]
    assert main(args) == 0  # default batch sizes 1 and 8: 8 is past the cache's 2 rows
    shown = capsys.readouterr().out
    assert "first token ms" in shown and "per token ms" in shown
    assert "batch 8 is past the artifact's static cache of 2 rows: timed at 2" in shown
    assert "not timed: torch.compile (--compile-mode none)" in shown
    assert "batch 2: artifact vs eager: first token" in shown


def test_bench_of_a_generation_export_needs_the_reference(
    gpt2_pt2: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", str(gpt2_pt2), "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["kind"] == "usage" and "--reference SRC_DIR" in error["message"]
    with pytest.raises(ptconvert.UsageError, match="static cache of 64"):
        ptconvert.bench(gpt2_pt2, reference=gpt2_pt2.parent, new_tokens=60, prompt_length=10)
