"""A batch's live display (issue #29): on a terminal, ``-j`` batches show a bar of the models
done and a line per model converting now, its name, the step its worker runs and its elapsed
time ticking; piped, under --json or -q, nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ptconvert import progress, render_progress
from ptconvert.convert.batch import convert_many
from ptconvert.options import Options


def slow_convert(src: str, to: str, output: str, opts: Options) -> Any:
    """``ptconvert.convert`` after a step that takes a while, as a program's export does (run
    in the workers)."""
    import ptconvert

    with progress.step("a slow step"):
        # one model well after the other: with -j 2 both ended within one frame under load,
        # and "1/2" was never drawn
        time.sleep(4.5 if "beta" in src else 2.2)
    return ptconvert.convert(src, to, output, opts)


@pytest.fixture()
def zoo(tmp_path: Path) -> Path:
    import torch

    from fixtures.models import MLP, seeded

    folder = tmp_path / "zoo"
    (folder / "nested").mkdir(parents=True)
    torch.save(seeded(MLP()).state_dict(), folder / "alpha.bin")
    torch.save(seeded(MLP()).state_dict(), folder / "nested" / "beta.bin")
    return folder


def _on_a_pty(run: Any) -> str:
    """What ``run()`` shows with a pty as fd 2 and the CLI's reporter installed."""
    master, slave = os.openpty()
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    saved = os.dup(2)
    os.dup2(slave, 2)
    try:
        progress.set_reporter(render_progress.TerminalProgress())
        run()
    finally:
        progress.set_reporter(None)
        os.dup2(saved, 2)
        os.close(saved)
        os.close(slave)
    time.sleep(0.2)
    os.close(master)
    reader.join(2)
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_batch_shows_each_running_model_and_the_models_done(
    zoo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: int
) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("COLUMNS", "100")
    reports: list[Any] = []

    def run() -> None:
        report = convert_many(
            zoo, "safetensors", tmp_path / "out", Options(), jobs=jobs, convert=slow_convert
        )
        reports.append(report)

    shown = _on_a_pty(run)
    assert reports and reports[0].counts["converted"] == 2, reports
    assert "converting 2 models to safetensors" in shown
    assert "alpha.bin" in shown and "nested/beta.bin" in shown
    assert re.search(r"\b0/2\b", shown) and re.search(r"\b1/2\b", shown), shown
    # each model's elapsed time moves while it converts (a second, then two)
    assert {"0:00:01", "0:00:02"} <= set(re.findall(r"\d:\d\d:\d\d", shown)), shown
    # the step running in the model's conversion: its own line in this process, on the
    # model's line from a worker
    assert ("a slow step" if jobs == 1 else "alpha.bin: a slow step") in shown, shown


def test_a_piped_batch_prints_no_display(zoo: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [str(zoo), "--to", "safetensors", "-o", str(out), "-j", "2"]
    run = subprocess.run(
        [sys.executable, "-m", "ptconvert", *args],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    assert (out / "alpha.safetensors").is_file()
