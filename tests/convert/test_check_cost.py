"""What the check of a written program costs beside the conversion: its fresh interpreter starts
before the converting process imports torch (both imports overlap), and ends as soon as its
verdict is written; what it proves is unchanged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ptconvert.convert.program_check import FreshLoad
from ptconvert.convert.state import RunState
from ptconvert.errors import VerificationError

# the conversion in a process of its own (this one imported torch already): every process it
# starts is noted with whether torch was imported in the converting process at that moment
SPY = """
import subprocess, sys
import ptconvert

started = []
real = subprocess.Popen


class Spy(real):
    def __init__(self, args, *rest, **kwargs):
        started.append(("torch" in sys.modules, " ".join(map(str, args))[-80:]))
        super().__init__(args, *rest, **kwargs)


subprocess.Popen = Spy
report = ptconvert.convert(
    sys.argv[1], "pt2", sys.argv[2], model="fixtures.models:MLP", inputs=["x:2x8:float32"],
    dynamic_batch=True, cache=False,
)
fresh = [imported for imported, args in started if "the file, loaded" in args]
print(report.check, report.parity.status, fresh)
"""


def test_the_fresh_interpreter_starts_before_the_conversion_imports_torch(
    samples: dict[str, Path], tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SPY, str(samples["mlp_zip"]), str(tmp_path / "m.pt2")],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent.parent.parent,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # one fresh interpreter, started while torch was not yet imported here
    assert done.stdout.split()[-3:] == ["parity", "pass", "[False]"], done.stdout


def _state(tmp_path: Path) -> RunState:
    return RunState(tmp_path / "src.pt", "pt")


def test_the_fresh_interpreter_ends_once_its_outputs_are_written(tmp_path: Path) -> None:
    """Its outputs come back; its own teardown (atexit handlers, torch's modules unloaded)
    never runs: nothing waits for it."""
    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(3, 2).eval(), (torch.randn(1, 3),)), path)
    marker = tmp_path / "torn-down"
    fresh = FreshLoad("pt2")
    try:
        fresh._load = (
            f"import atexit\natexit.register(lambda: open({str(marker)!r}, 'w').close())\n"
            + fresh._load
        )
        fresh.load(path, run={"input": torch.ones(1, 3)}, positional=["input"])
        outputs = fresh.finish(_state(tmp_path))
    finally:
        fresh.stop()
    assert outputs is not None and outputs[0].shape == (1, 2)
    assert not marker.exists()


def test_a_file_that_does_not_load_in_the_fresh_interpreter_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "broken.pt2"
    path.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: no program in it
    fresh = FreshLoad("pt2")
    try:
        fresh.load(path, run={"x": torch.ones(1, 3)})
        with pytest.raises(VerificationError, match="does not load in a fresh Python process"):
            fresh.finish(_state(tmp_path))
    finally:
        fresh.stop()
