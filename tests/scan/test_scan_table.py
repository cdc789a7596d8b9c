"""``ptconvert scan``'s table at 80 and 100 columns (issue 44): one table of the files, no word
broken across lines (verdicts, reasons; a path breaks only after a ``/``)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from ptconvert import render
from ptconvert.scan.scanner import scan

PAYLOAD = b"\x80\x02cposix\nsystem\n(Vtouch x\ntR."


@pytest.mark.parametrize("width", [80, 100])
def test_the_scan_table_is_one_table_and_breaks_no_word(tmp_path: Path, width: int) -> None:
    import torch

    deep = tmp_path / "checkpoints-of-a-rather-long-experiment-name" / "epoch-0042" / "shards"
    deep.mkdir(parents=True)
    torch.save(torch.nn.Linear(2, 2), deep / "whole_model_with_a_long_name.pt")
    (deep / "dangerous_payload_renamed.txt").write_bytes(PAYLOAD)
    torch.save({"w": torch.zeros(2)}, deep / "pytorch_model-00001-of-00002.bin")
    (deep / "train.log").write_text("step 1\n")
    report = scan([tmp_path])
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    render.render_scan(report, console)
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, text
    assert sum(1 for line in lines if line.split()[:2] == ["file", "verdict"]) == 1, text
    assert "train.log" not in text and "1 skipped" in text
    tokens = set(text.split())
    for f in report.files:
        assert f.verdict in tokens, (f.verdict, text)
        for part in Path(f.path).parts[1:]:  # each folder and name whole, on some line
            assert any(part in line for line in lines), (part, text)
        for x in f.findings:
            words = [w for w in f"{x.global_name}: {x.reason}".split() if "/" not in w]
            assert all(w in tokens for w in words), (x.reason, text)
