"""The cache of verified programs: hits, misses, refills, four processes filling one entry at
once, and cache directories a conversion must refuse (another user's, read-only) with exit 12.

A cache filled by one real conversion is made once per module and copied into each test's own
cache (the autouse ``cache_dir`` fixture of conftest.py points PTCONVERT_CACHE at it)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import ptconvert
from fixtures.models import MLP
from ptconvert.cli import main
from ptconvert.convert import cache
from ptconvert.formats import detect
from ptconvert.options import Options
from tests.conftest import run_cli

SPEC = {"model": "fixtures.models:MLP", "inputs": ["x:2x8:float32"]}
SPEC_ARGS = ["--model", "fixtures.models:MLP", "--input", "x:2x8:float32"]
ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("model") / "mlp.pt"
    torch.save(MLP().state_dict(), path)
    return path


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> Path:
    """A cache holding the checkpoint's pt2, filled by a real (verified) conversion. Under
    pytest-xdist the workers share it through the cache itself: the first fills it, the others
    wait on the entry's lock and find it complete."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    base = tmp_path_factory.getbasetemp()
    root = base.parent / f"filled-cache-{run}" if run else base / "filled-cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PTCONVERT_CACHE", str(root))
        out = tmp_path_factory.mktemp("first") / "first.pt2"
        report = ptconvert.convert(checkpoint, "pt2", out, **SPEC)
    assert report.check == "parity"
    return root


def _use(filled: Path, cache_dir: Path) -> Path:
    shutil.copytree(filled, cache_dir, dirs_exist_ok=True)
    (entry,) = (cache_dir / "entries").iterdir()
    return entry


def _eager(checkpoint: Path) -> torch.nn.Module:
    model = MLP()
    model.load_state_dict(torch.load(checkpoint, weights_only=True))
    return model.eval()


def _computes_as_eager(pt2: Path, checkpoint: Path) -> torch.Tensor:
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(1))
    got = torch.export.load(pt2).module()(x)
    torch.testing.assert_close(got, _eager(checkpoint)(x))
    return got


def _tree(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for p in root.rglob("*")}


def test_a_second_conversion_is_a_hit(
    filled: Path, cache_dir: Path, checkpoint: Path, tmp_path: Path
) -> None:
    _use(filled, cache_dir)
    before = _tree(cache_dir)
    report = ptconvert.convert(checkpoint, "pt2", tmp_path / "again.pt2", **SPEC)
    assert report.cached and report.to_dict()["cached"] is True
    assert report.check == "parity" and report.parity is not None
    assert report.parity.status == "pass"
    assert report.output == str(tmp_path / "again.pt2")
    assert report.notes[-1].startswith("from the cache (entry ")
    _computes_as_eager(tmp_path / "again.pt2", checkpoint)
    assert len(list((cache_dir / "entries").iterdir())) == 1
    # a --no-verify request may use the verified entry
    unchecked = ptconvert.convert(checkpoint, "pt2", tmp_path / "u.pt2", verify=False, **SPEC)
    assert unchecked.cached
    assert {k for k in _tree(cache_dir) if "locks" not in k} == {
        k for k in before if "locks" not in k
    }


def test_the_key_follows_content_and_the_options_that_change_the_artifact(
    checkpoint: Path, tmp_path: Path
) -> None:
    d = detect(checkpoint)

    def key(opts: Options, target: str = "pt2", det: Any = d, out: str = "o.pt2") -> str:
        return cache.cache_key(det, target, tmp_path / out, opts)[0]

    base = key(Options(**SPEC))
    # what does not change the bytes: not in the key (a new option is, by default)
    for name in cache.NOT_IN_KEY:
        assert hasattr(Options(), name), name
    assert key(Options(**SPEC, force=True, verify=False, force_memory=True, cache=False)) == base
    assert key(Options(**SPEC), out="elsewhere.pt2") == base  # pt2 names no companion
    assert key(Options(**SPEC, dynamic_batch=True)) != base
    assert key(Options(**SPEC, seed=1)) != base
    assert key(Options(**SPEC), "torchscript", out="o.ts") != base
    # the onnx file names its external data by the output's name
    assert key(Options(**SPEC), "onnx", out="a.onnx") != key(Options(**SPEC), "onnx", out="b.onnx")
    # the content, not the name: a renamed copy is the same source, other bytes are not
    copy = tmp_path / "renamed.pt"
    shutil.copyfile(checkpoint, copy)
    assert key(Options(**SPEC), det=detect(copy)) == base
    torch.manual_seed(5)
    torch.save(MLP().state_dict(), tmp_path / "other.pt")
    assert key(Options(**SPEC), det=detect(tmp_path / "other.pt")) != base
    # a file.py model spec: its content
    (tmp_path / "net.py").write_text("from fixtures.models import MLP\nmake = MLP\n")
    by_file = key(Options(model=f"{tmp_path / 'net.py'}:make", inputs=SPEC["inputs"]))
    (tmp_path / "net.py").write_text("from fixtures.models import MLP\nmake = MLP  # v2\n")
    assert key(Options(model=f"{tmp_path / 'net.py'}:make", inputs=SPEC["inputs"])) != by_file
    inputs = cache.cache_key(d, "pt2", tmp_path / "o.pt2", Options(**SPEC))[1]
    assert inputs["model_source"]  # fixtures/models.py, found without importing anything new
    assert inputs["versions"]["torch"] == str(torch.__version__)


def test_a_directory_is_keyed_by_every_file_it_loads_from(tmp_path: Path) -> None:
    from types import SimpleNamespace

    (tmp_path / "sub").mkdir()
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "sub" / "model.safetensors").write_bytes(b"w")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "pack").write_bytes(b"a second copy of the weights")
    files = cache._source_files(SimpleNamespace(path=tmp_path))  # type: ignore[arg-type]
    assert [name for name, _ in files] == ["config.json", "sub/model.safetensors"]


def test_changed_bytes_or_options_are_misses(
    filled: Path, cache_dir: Path, checkpoint: Path, tmp_path: Path
) -> None:
    _use(filled, cache_dir)
    torch.manual_seed(5)
    other = tmp_path / "other.pt"
    torch.save(MLP().state_dict(), other)
    changed = ptconvert.convert(other, "pt2", tmp_path / "o.pt2", verify=False, **SPEC)
    seeded = ptconvert.convert(checkpoint, "pt2", tmp_path / "s.pt2", verify=False, seed=3, **SPEC)
    assert not changed.cached and not seeded.cached  # (every option: the key's own test)
    assert len(list((cache_dir / "entries").iterdir())) == 1  # --no-verify stores nothing


def test_no_cache_neither_reads_nor_writes(
    filled: Path, cache_dir: Path, checkpoint: Path, tmp_path: Path, capsys: Any
) -> None:
    _use(filled, cache_dir)
    before = _tree(cache_dir)
    out = tmp_path / "n.pt2"
    code, report, _ = run_cli(
        [str(checkpoint), "--to", "pt2", "-o", str(out), *SPEC_ARGS, "--no-cache", "--no-verify"],
        capsys,
    )
    assert code == 0 and report["cached"] is False
    assert _tree(cache_dir) == before
    _computes_as_eager(out, checkpoint)


def test_a_failed_check_stores_nothing(
    cache_dir: Path, checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ptconvert.convert import engine

    def differs(*args: Any, **kwargs: Any) -> Any:
        raise ptconvert.VerificationError("differs (on purpose)")

    monkeypatch.setattr(engine, "_verify", differs)
    with pytest.raises(ptconvert.VerificationError, match="on purpose"):
        ptconvert.convert(checkpoint, "pt2", tmp_path / "bad.pt2", **SPEC)
    assert not (tmp_path / "bad.pt2").exists()
    assert not list((cache_dir / "entries").iterdir()) and not list((cache_dir / "tmp").iterdir())
    cleared = ptconvert.cache_clear()  # and the key's lock was let go
    assert cleared.busy == [] and cleared.removed == 0


def test_incomplete_or_corrupt_entries_are_misses(
    filled: Path, cache_dir: Path, checkpoint: Path, tmp_path: Path
) -> None:
    entry = _use(filled, cache_dir)
    (artifact,) = (entry / "files").iterdir()
    good = artifact.read_bytes()
    data = bytearray(good)
    data[len(data) // 2] ^= 0xFF  # same size, other bytes: found as it is copied out
    artifact.write_bytes(bytes(data))
    corrupt = ptconvert.convert(checkpoint, "pt2", tmp_path / "c.pt2", verify=False, **SPEC)
    assert not corrupt.cached
    artifact.write_bytes(good)
    (entry / "complete.json").unlink()  # an interrupted fill
    assert ptconvert.cache_info().incomplete == 1
    incomplete = ptconvert.convert(checkpoint, "pt2", tmp_path / "i.pt2", verify=False, **SPEC)
    assert not incomplete.cached
    _computes_as_eager(tmp_path / "i.pt2", checkpoint)


def test_four_processes_refilling_one_entry_leave_one_good_artifact(
    cache_dir: Path, checkpoint: Path, tmp_path: Path
) -> None:
    """Four CLI processes convert the same model with one cache at once, over an entry an
    interrupted fill left (files, no complete.json, a tmp folder): one converts and refills it,
    three wait and copy it."""
    outs = [tmp_path / f"out{i}.pt2" for i in range(4)]
    key = cache.cache_key(detect(checkpoint), "pt2", outs[0], Options(**SPEC))[0]
    (cache_dir / "entries" / key / "files").mkdir(parents=True)
    (cache_dir / "entries" / key / "files" / "out0.pt2").write_bytes(b"PK half written")
    (cache_dir / "tmp" / f"{key}.dead").mkdir(parents=True)
    convert = [sys.executable, "-m", "ptconvert", str(checkpoint), "--to", "pt2", *SPEC_ARGS]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [*convert, "-o", str(out), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        for out in outs
    ]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-2000:] for _, err in results]
    reports = [json.loads(out) for out, _ in results]
    assert sorted(r["cached"] for r in reports) == [False, True, True, True]
    assert all(r["check"] == "parity" for r in reports)
    assert [e.name for e in (cache_dir / "entries").iterdir()] == [key]  # the CLI's key too
    assert (cache_dir / "entries" / key / "complete.json").exists()
    assert not list((cache_dir / "tmp").iterdir())
    first, *others = [_computes_as_eager(out, checkpoint) for out in outs]
    for got in others:
        assert torch.equal(got, first)
    assert len(ptconvert.cache_info().entries) == 1


@pytest.mark.parametrize("fault", ["read-only", "another user", "entries read-only"])
def test_an_unusable_cache_directory_is_exit_12(
    fault: str, cache_dir: Path, checkpoint: Path, tmp_path: Path, capsys: Any
) -> None:
    folder = cache_dir
    if fault == "entries read-only":
        folder = cache_dir / "entries"
        folder.mkdir()
    if fault == "another user":
        os.chown(folder, 12345, -1)
    else:
        folder.chmod(0o555)
    try:
        out = tmp_path / "m.pt2"
        code = main([str(checkpoint), "--to", "pt2", "-o", str(out), *SPEC_ARGS])
        err = capsys.readouterr().err
        assert code == 12, err
        assert str(folder) in err and "--no-cache" in err and "Traceback" not in err
        assert ("owned by uid 12345" if fault == "another user" else "read-only") in err
        assert not out.exists()
        code, report, _ = run_cli(
            [str(checkpoint), "--to", "pt2", "-o", str(out), *SPEC_ARGS], capsys
        )
        assert code == 12 and report["error"]["kind"] == "cache"
        assert ptconvert.cache_info().problem
        assert main(["cache", "clear"]) == 12
        capsys.readouterr()
        # weights conversions are not cached: the directory is not asked for
        weights = ptconvert.convert(checkpoint, "safetensors", tmp_path / "w.safetensors")
        assert weights.check == "bitwise"
    finally:
        os.chown(folder, os.geteuid(), -1)
        folder.chmod(0o755)


def test_a_read_only_filesystem_is_exit_12(
    cache_dir: Path, checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def read_only(path: Any, *args: Any, **kwargs: Any) -> int:
        if str(path).startswith(str(cache_dir)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(ptconvert.PtconvertError) as err:
        ptconvert.convert(checkpoint, "pt2", tmp_path / "m.pt2", **SPEC)
    assert err.value.exit_code == 12
    assert "read-only filesystem" in err.value.message and str(cache_dir) in str(err.value)


def test_cache_info_and_clear_through_the_cli(filled: Path, cache_dir: Path, capsys: Any) -> None:
    entry = _use(filled, cache_dir)
    code, info, _ = run_cli(["cache", "info"], capsys)
    assert code == 0 and info["root"] == str(cache_dir)
    (only,) = info["entries"]
    assert only["key"] == entry.name and only["target"] == "pt2" and only["source"] == "mlp.pt"
    assert only["bytes"] > 0 and info["total_bytes"] >= only["bytes"]
    assert main(["cache", "info"]) == 0
    assert "1 entries" in capsys.readouterr().out
    # an entry another process is copying out is left alone, and said
    lock = os.open(cache_dir / "locks" / f"{entry.name}.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(lock, fcntl.LOCK_SH)
        code, cleared, _ = run_cli(["cache", "clear"], capsys)
        assert code == 0 and cleared["busy"] == [entry.name] and entry.exists()
    finally:
        os.close(lock)
    assert main(["cache", "clear"]) == 0
    assert "1 entries removed" in capsys.readouterr().out
    assert not entry.exists() and not list((cache_dir / "locks").iterdir())
    code, info, _ = run_cli(["cache", "info"], capsys)
    assert info["entries"] == [] and info["incomplete"] == 0
