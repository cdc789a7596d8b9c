"""Every load of a TorchScript archive is bounded: one whose scripted ``__setstate__`` loops
for as long as its own state says (and scans clean) is stopped at ``--load-timeout`` by every
command that loads it, nothing is written and no process is left behind, even when ptconvert
itself is killed. Archives without ``__setstate__`` load in this process, no child started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import ptconvert
from fixtures.hostile_torchscript import looping_setstate
from ptconvert.formats.torchscript import probe as torchscript_probe
from tests.conftest import run_cli

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")

ROOT = Path(__file__).resolve().parents[2]
INPUT = ["--input", "x:1x4:float32"]


@pytest.fixture(scope="module")
def looping(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return looping_setstate(tmp_path_factory.mktemp("hostile-ts") / "looping.pt")


def test_the_sample_scans_clean(looping: Path) -> None:
    assert ptconvert.scan([looping]).verdict in ("clean", "needs-code")


def _command(name: str, src: Path, out: Path) -> list[str]:
    if name == "verify":
        return ["verify", str(src), str(src), *INPUT]
    extra = [] if name == "torchscript" else INPUT
    return [str(src), "--to", name, "-o", str(out), *extra]


@pytest.mark.parametrize("name", ["torchscript", "pt2", "onnx", "verify"])
def test_a_load_that_never_ends_is_stopped(
    name: str, looping: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if name == "onnx":
        pytest.importorskip("onnx")
    before = _children()
    out = tmp_path / "out" / f"model.{name}"
    out.parent.mkdir()
    started = time.monotonic()
    code, body, err = run_cli([*_command(name, looping, out), "--load-timeout", "5"], capsys)
    assert time.monotonic() - started < 60
    said = json.dumps(body) + err
    assert code == 3, said
    assert str(looping) in said and "--load-timeout" in said and "within 5 s" in said
    assert list(out.parent.iterdir()) == []  # nothing written, no staging file left
    assert _children() == before


def test_an_archive_without_setstate_starts_no_child(
    samples: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    probed: list[Path] = []
    monkeypatch.setattr(torchscript_probe, "_probe", lambda path, limit: probed.append(path))
    src = samples["mlp_scripted"]
    code, body, _ = run_cli(
        [str(src), "--to", "pt2", "--input", "x:2x8:float32", "-o", str(tmp_path / "m.pt2")],
        capsys,
    )
    assert code == 0, body
    assert probed == []


def test_a_setstate_that_ends_converts_after_one_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src = looping_setstate(tmp_path / "short.pt", iterations=1000)
    probed: list[Path] = []
    real = torchscript_probe._probe

    def spy(path: Path, limit: float) -> None:
        probed.append(path)
        real(path, limit)

    monkeypatch.setattr(torchscript_probe, "_probe", spy)
    out = tmp_path / "short.pt2"
    code, body, _ = run_cli([str(src), "--to", "pt2", *INPUT, "-o", str(out)], capsys)
    assert code == 0, body
    assert out.exists() and probed == [src]  # loaded twice (weights, reference): probed once


def test_the_probe_dies_with_a_killed_ptconvert(looping: Path, tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("ptconvert")
    argv = [str(exe), str(looping), "--to", "torchscript", "-o", str(tmp_path / "o.pt")]
    parent = subprocess.Popen(
        [*argv, "--load-timeout", "600"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        probe = None
        deadline = time.monotonic() + 60
        while probe is None and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.3)
            probe = next((p for p in _children_of(parent.pid) if _is_probe(p)), None)
        assert probe is not None, "the probe never started"
        while b"libtorch" not in _maps(probe) and time.monotonic() < deadline:
            time.sleep(0.3)  # until it imported torch: past die_with_parent, loading
        time.sleep(1)
        assert _alive(probe), "the probe ended by itself"
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(probe) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(probe), "the probe outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def _is_probe(pid: int) -> bool:
    cmdline = _cmdline(pid)
    return b"spawn_main" in cmdline and b"resource_tracker" not in cmdline


def _children() -> set[int]:
    """This process's live children but multiprocessing's resource tracker (it lives as long
    as the test process)."""
    return {p for p in _children_of(os.getpid()) if b"resource_tracker" not in _cmdline(p)}


def _children_of(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat(stat)
        if fields and int(fields[1]) == pid and fields[0] != "Z":
            kids.append(int(stat.parent.name))
    return kids


def _alive(pid: int) -> bool:
    fields = _stat(Path(f"/proc/{pid}/stat"))
    return bool(fields) and fields[0] != "Z"


def _stat(path: Path) -> list[Any]:
    try:
        return path.read_text().rpartition(")")[2].split()
    except OSError:
        return []


def _maps(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/maps").read_bytes()
    except OSError:
        return b""


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
