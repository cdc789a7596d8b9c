"""Nothing left behind: a run's temporary folder is removed on every exit Python sees, and the
one of a run killed with ``kill -9`` (a conversion, a batch worker) by the next run that writes
there; only complete outputs remain."""

from __future__ import annotations

import fcntl
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from safetensors import safe_open

import ptconvert
from ptconvert import atomic
from ptconvert.errors import VerificationError
from tests.conftest import run_cli
from tests.faults.conftest import checkpoint, cli, temporaries


def _wait_for(found: Any, proc: Any, timeout: float = 120.0) -> Any:
    """Poll ``found()`` until it returns something (or the process ends first)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = found()
        if value:
            return value
        if proc.poll() is not None:
            pytest.fail(f"the run ended before the moment to kill it: {proc.communicate()}")
        time.sleep(0.002)
    pytest.fail("timed out")


def _complete(out: Path, names: set[str]) -> None:
    with safe_open(out, "np") as f:
        assert set(f.keys()) == names


def test_a_failed_conversion_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def wrong(*args: Any, **kwargs: Any) -> Any:
        raise VerificationError("differs", path=args[1])  # names the temporary file

    monkeypatch.setattr("ptconvert.convert.weights.verify_weights", wrong)
    src, out = checkpoint(tmp_path / "m.pt"), tmp_path / "out" / "m.safetensors"
    code, report, _ = run_cli([str(src), "--to", "safetensors", "-o", str(out)], capsys)
    assert (code, report["error"]["path"]) == (6, str(out))
    assert not out.parent.exists()  # nothing left: not even the folder made for it


def test_kill_9_while_writing_weights_then_a_rerun_leaves_only_the_output(tmp_path: Path) -> None:
    src = checkpoint(tmp_path / "big.pt", 300)
    out_dir = tmp_path / "out"
    out = out_dir / "big.safetensors"
    run = cli(str(src), "--to", "safetensors", "-o", str(out))

    def partial() -> bool:  # the header is written, the tensors are being copied
        return any(p.stat().st_size > 0 for p in out_dir.glob(f".*/{out.name}"))

    _wait_for(partial, run)
    run.send_signal(signal.SIGKILL)
    run.wait()
    assert temporaries(out_dir) and not out.exists()  # what the killed run left
    rerun = cli(str(src), "--to", "safetensors", "-o", str(out))
    assert rerun.wait() == 0, rerun.communicate()
    assert os.listdir(out_dir) == [out.name]
    _complete(out, {"big", "small"})


def test_kill_9_during_a_program_conversion_then_a_rerun_leaves_only_the_output(
    tmp_path: Path,
) -> None:
    import torch

    from fixtures.models import MLP

    src = tmp_path / "mlp.pt"
    torch.save(MLP().state_dict(), src)
    out = tmp_path / "out" / "mlp.pt2"
    args = [str(src), "--to", "pt2", "-o", str(out), "--model", "fixtures.models:MLP"]
    args += ["--input", "x:2x8:float32", "--no-cache"]
    run = cli(*args)
    _wait_for(lambda: temporaries(out.parent), run)
    run.send_signal(signal.SIGKILL)
    run.wait()
    rerun = cli(*args)
    assert rerun.wait() == 0, rerun.communicate()
    assert os.listdir(out.parent) == [out.name]


def test_a_killed_batch_worker_leaves_nothing_in_the_output_folder(tmp_path: Path) -> None:
    zoo, out_dir = tmp_path / "zoo", tmp_path / "out"
    zoo.mkdir()
    for name in ("a", "b"):
        checkpoint(zoo / f"{name}.pt", 150)
    run = cli(str(zoo), "--to", "safetensors", "-o", str(out_dir), "-j", "2")

    def worker_writing() -> int | None:
        for p in temporaries(out_dir):
            pid = int(p.name.rsplit(".", 2)[-2].split("-")[0])
            if pid != run.pid:
                return pid
        return None

    os.kill(_wait_for(worker_writing, run), signal.SIGKILL)
    assert run.wait() == 0, run.communicate()  # the dead worker's models ran again, alone
    assert temporaries(out_dir) == []
    for name in ("a", "b"):
        _complete(out_dir / f"{name}.safetensors", {"big", "small"})


def _temp(folder: Path, pid: int, host: str, tag: str, age_s: float = 0) -> Path:
    """A temporary folder as ``atomic.temp_folder`` names them, ``age_s`` untouched."""
    path = folder / f".out.safetensors.{pid}-{host}-{tag}{atomic.TEMP_SUFFIX}"
    path.mkdir()
    (path / "out.safetensors").write_bytes(b"half")
    stamp = time.time() - age_s
    for p in (path / "out.safetensors", path):
        os.utime(p, (stamp, stamp))
    return path


def test_the_sweep_removes_only_dead_runs_folders_of_this_user(tmp_path: Path) -> None:
    here = atomic._host()
    other = "f" * 6 if here != "f" * 6 else "e" * 6
    dead = _dead_pid()
    gone = _temp(tmp_path, dead, here, "gone")  # a process of this host that is gone: at once
    alive = _temp(tmp_path, os.getpid(), here, "alive")  # this process: kept
    elsewhere_new = _temp(tmp_path, dead, other, "new")  # another host's, recent: kept
    elsewhere_old = _temp(tmp_path, dead, other, "old", age_s=120)  # 2 min untouched: removed
    locked = _temp(tmp_path, dead, other, "locked", age_s=120)  # its process holds the lock
    foreign = _temp(tmp_path, dead, here, "foreign")  # another user's: never
    if os.getuid() == 0:
        os.chown(foreign, 12345, 12345)
    unrelated = tmp_path / f".notes.{dead}-{here}-abcd1234"
    unrelated.mkdir()
    fd = os.open(locked, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        removed = atomic.sweep(tmp_path)
    finally:
        os.close(fd)
    expected = [gone, elsewhere_old] + ([] if os.getuid() == 0 else [foreign])
    assert sorted(removed) == sorted(expected)
    assert all(p.exists() for p in (alive, elsewhere_new, locked, unrelated))


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_the_api_cleans_up_on_interrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr("ptconvert.convert.weights.verify_weights", interrupted)
    src, out = checkpoint(tmp_path / "m.pt"), tmp_path / "out" / "m.safetensors"
    with pytest.raises(KeyboardInterrupt):
        ptconvert.convert(src, "safetensors", out)
    assert not out.parent.exists()  # nothing left: not even the folder made for it


def _dies_while_writing(src: str, to: str, output: str, opts: Any) -> Any:
    """ptconvert.convert, except that the process dies halfway through writing, every time."""
    with atomic.atomic_path(Path(output)) as tmp:
        tmp.write_bytes(b"half")
        os._exit(9)


def test_a_worker_that_dies_on_its_last_try_leaves_nothing(tmp_path: Path) -> None:
    from ptconvert.convert.batch import convert_many
    from ptconvert.options import Options

    zoo, out_dir = tmp_path / "zoo", tmp_path / "out"
    (zoo / "sub").mkdir(parents=True)
    checkpoint(zoo / "sub" / "a.pt")
    report = convert_many(
        zoo, "safetensors", out_dir, Options(), jobs=2, convert=_dies_while_writing
    )
    assert [(i.src, i.status) for i in report.items] == [("sub/a.pt", "failed")]
    assert temporaries(out_dir) == []
