"""The cache of verified programs: hits, misses, refills, four processes filling one entry at
once, and cache directories a conversion must refuse (another user's, read-only) with exit 12.

A cache filled by one real conversion is made once per module and copied into each test's own
cache (the autouse ``cache_dir`` fixture of conftest.py points PTCONVERT_CACHE at it)."""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import shutil
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import torch

import ptconvert
from fixtures.models import MLP
from ptconvert.cli import main
from ptconvert.convert import cache, cache_key, cache_store
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


def test_a_hit_reports_every_field_the_conversion_reported(
    filled: Path, cache_dir: Path, checkpoint: Path, tmp_path: Path
) -> None:
    """The stored report is read back by ConversionReport.from_dict, not field by field: each
    field the filling conversion reported comes back (but the source, output, time and the
    cache's note, which are the hit's own); a stored field the class does not know is a miss."""
    entry = _use(filled, cache_dir)
    stored = json.loads((entry / "complete.json").read_text())["report"]
    report = ptconvert.convert(checkpoint, "pt2", tmp_path / "again.pt2", **SPEC)
    assert report.cached
    got = report.to_dict()
    for own in ("source", "output", "seconds", "notes", "cached", "bench"):
        got.pop(own), stored.pop(own)
    assert got == stored
    record = json.loads((entry / "complete.json").read_text())
    record["report"]["a_field_of_a_newer_version"] = 1
    (entry / "complete.json").write_text(json.dumps(record))
    again = ptconvert.convert(checkpoint, "pt2", tmp_path / "third.pt2", **SPEC)
    assert not again.cached


def test_a_report_round_trips_through_its_dict(checkpoint: Path, tmp_path: Path) -> None:
    from ptconvert.convert.conversion_report import ConversionReport

    report = ptconvert.convert(checkpoint, "pt2", tmp_path / "m.pt2", cache=False, **SPEC)
    back = ConversionReport.from_dict(json.loads(report.to_json()))
    assert back == dataclasses.replace(report, bench=back.bench)
    assert back.parity is not None and back.parity.sizes[0].outputs[0].status == "pass"
    with pytest.raises(ValueError, match="no field"):
        ConversionReport.from_dict({**report.to_dict(), "unknown": 1})


def test_the_key_follows_content_and_the_options_that_change_the_artifact(
    checkpoint: Path, tmp_path: Path
) -> None:
    d = detect(checkpoint)

    def key(opts: Options, target: str = "pt2", det: Any = d, out: str = "o.pt2") -> str:
        return cache_key.cache_key(det, target, tmp_path / out, opts)[0]

    base = key(Options(**SPEC))
    assert key(Options(**SPEC), out="elsewhere.pt2") == base  # pt2 names no companion
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
    inputs = cache_key.cache_key(d, "pt2", tmp_path / "o.pt2", Options(**SPEC))[1]
    assert inputs["model_source"]  # fixtures/models.py, found without importing anything new
    assert inputs["versions"]["torch"] == str(torch.__version__)


def test_a_source_is_hashed_once_a_process_and_again_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45: the manifest's key, the cache's lookup and each target of ``--to all`` hashed
    the whole source again; now once, until its bytes (size, mtime, inode) change."""
    src = tmp_path / "m.pt"
    torch.save(MLP().state_dict(), src)
    reads: list[Path] = []
    hash_file = cache_key._hash_file
    monkeypatch.setattr(cache_key, "_hash_file", lambda p, h: reads.append(p) or hash_file(p, h))
    first = cache_key.cache_key(detect(src), "pt2", tmp_path / "o.pt2", Options(**SPEC))[0]
    again = cache_key.cache_key(detect(src), "onnx", tmp_path / "o.onnx", Options(**SPEC))[0]
    assert reads.count(src) == 1 and first != again
    state = MLP().state_dict()
    state["fc1.bias"] += 1  # the same size, other bytes
    torch.save(state, src)
    os.utime(src, ns=(1, 1))  # even at an older mtime
    changed = cache_key.cache_key(detect(src), "pt2", tmp_path / "o.pt2", Options(**SPEC))[0]
    assert reads.count(src) == 2 and changed != first


def _another_value(f: dataclasses.Field[Any], kind: Any, tmp_path: Path) -> Any:
    """A value of the option's type other than its default."""
    default = getattr(Options(), f.name)
    if f.name == "example_inputs":  # keyed by the file's content
        path = tmp_path / "example.pt"
        torch.save({"x": torch.ones(2, 8)}, path)
        return path
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None: an X
        (kind,) = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) is typing.Literal:
        return next(a for a in typing.get_args(kind) if a != default)
    base = typing.get_origin(kind) or kind
    if base is bool:
        return not default
    if base is int:
        return (default or 0) + 1
    if base is float:
        return (default or 0.0) + 1.0
    if base is str:
        return "changed"
    if base is list and typing.get_args(kind) == (int,):
        return [*(default or []), 4]
    if base is list:
        return [*default, "x:4x8:float32"]
    if base is Path:
        return tmp_path
    if base is dict:
        return {**default, "changed": "1"}
    raise AssertionError(f"Options.{f.name}: give this test a changed value of {kind}")


def test_every_option_is_in_the_key_but_those_that_do_not_change_the_artifact(
    checkpoint: Path, tmp_path: Path
) -> None:
    """Each Options field changed alone: the key changes, but for NOT_IN_KEY's (a new option
    is in the key by default)."""
    d = detect(checkpoint)
    base = cache_key.cache_key(d, "pt2", tmp_path / "o.pt2", Options(**SPEC))[0]
    kinds = typing.get_type_hints(Options)
    fields = dataclasses.fields(Options)
    assert set(cache_key.NOT_IN_KEY) <= {f.name for f in fields}
    for f in fields:
        opts = dataclasses.replace(
            Options(**SPEC), **{f.name: _another_value(f, kinds[f.name], tmp_path)}
        )
        assert getattr(opts, f.name) != getattr(Options(**SPEC), f.name), f.name
        changed = cache_key.cache_key(d, "pt2", tmp_path / "o.pt2", opts)[0]
        if f.name in cache_key.NOT_IN_KEY:
            assert changed == base, f"{f.name} is in NOT_IN_KEY but changes the key"
        else:
            assert changed != base, f"{f.name} does not change the key"


def test_a_targets_own_options_key_that_target_only(checkpoint: Path, tmp_path: Path) -> None:
    """``--opset`` (the ONNX target's option, ``Options.target_options``) changes an ONNX
    artifact's key and not a pt2's; ``--pte-backend`` a .pte's."""
    d = detect(checkpoint)

    def key(to: str, **own: Any) -> str:
        opts = Options(**SPEC, target_options=own)
        return cache_key.cache_key(d, to, tmp_path / f"o.{to}", opts)[0]

    assert key("onnx", opset=17) != key("onnx") != key("onnx", opset=18)
    assert key("pt2", opset=17) == key("pt2")
    assert key("pte", pte_backend="portable") != key("pte") == key("pte", opset=17)


def test_the_key_follows_inductor_settings_plugins_and_the_gpu(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.metadata

    d = detect(checkpoint)

    def key(**options: Any) -> str:
        return cache_key.cache_key(d, "aoti", tmp_path / "o.pt2", Options(**SPEC, **options))[0]

    for name in [n for n in os.environ if n.startswith(cache_key.KEYED_ENVIRONMENT)]:
        monkeypatch.delenv(name)
    base = key()
    monkeypatch.setenv("PTCONVERT_UNRELATED", "1")
    # where Inductor keeps compiled kernels: torch sets it in os.environ when it first compiles
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    assert key() == base
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE", "1")
    tuned = key()
    assert tuned != base
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE", "0")
    assert key() not in (base, tuned)
    monkeypatch.delenv("TORCHINDUCTOR_MAX_AUTOTUNE")
    monkeypatch.setenv("TORCH_COMPILE_DYNAMIC", "1")
    assert key() != base
    monkeypatch.delenv("TORCH_COMPILE_DYNAMIC")
    assert key() == base

    # a plugin installed, then upgraded: each a miss
    installed = importlib.metadata.entry_points

    def plugins(version: str) -> Any:
        dist = types.SimpleNamespace(name="ptconvert-toy", version=version)
        ep = types.SimpleNamespace(name="toy", value="ptconvert_toy:register", dist=dist)
        return lambda group=None: [ep] if group == "ptconvert.plugins" else []

    monkeypatch.setattr(importlib.metadata, "entry_points", plugins("1.0"))
    with_plugin = key()
    assert with_plugin != base
    inputs = cache_key.cache_key(d, "aoti", tmp_path / "o.pt2", Options(**SPEC))[1]
    assert inputs["plugins"] == [
        {"entry_point": "toy=ptconvert_toy:register", "dist": "ptconvert-toy", "version": "1.0"}
    ]
    monkeypatch.setattr(importlib.metadata, "entry_points", plugins("1.1"))
    assert key() not in (base, with_plugin)
    monkeypatch.setattr(importlib.metadata, "entry_points", installed)
    assert key() == base

    # --device cuda: the GPU it is compiled for, and torch's CUDA; said when there is none
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    no_gpu = key(device="cuda")
    assert no_gpu != key()
    inputs = cache_key.cache_key(d, "aoti", tmp_path / "o.pt2", Options(**SPEC, device="cuda"))[1]
    assert inputs["gpu"] == {"seen": False}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    hopper = key(device="cuda")
    assert hopper != no_gpu
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    ampere = key(device="cuda")
    assert ampere not in (hopper, no_gpu)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert key(device="cuda") not in (ampere, hopper, no_gpu)
    assert key() == base  # the CPU's programs do not depend on the GPU


def test_a_pickled_module_is_not_cached(
    cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole pickled module (--trust) runs the forward of a class the key does not cover:
    a changed forward must not be answered from the cache."""
    (tmp_path / "code").mkdir()
    net = tmp_path / "code" / "cached_net.py"
    forward = "import torch\n\nclass Net(torch.nn.Module):\n" + (
        "    def __init__(self):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 3)\n\n"
        "    def forward(self, x):\n        return self.fc(x) * {}\n"
    )
    net.write_text(forward.format("2"))
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    import cached_net  # type: ignore[import-not-found]

    torch.manual_seed(0)
    model = cached_net.Net().eval()
    torch.save(model, tmp_path / "net.pt")
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = model.fc(x)
    spec = {"trust": True, "inputs": ["x:2x4:float32"]}
    first = ptconvert.convert(tmp_path / "net.pt", "pt2", tmp_path / "a.pt2", **spec)
    assert not first.cached and first.check == "parity"
    torch.testing.assert_close(torch.export.load(tmp_path / "a.pt2").module()(x), plain * 2)

    net.write_text(forward.format("3.0"))  # the class's forward edited, its pickle unchanged
    monkeypatch.delitem(sys.modules, "cached_net")
    # (--no-verify: it may use a verified entry, and is quicker)
    second = ptconvert.convert(tmp_path / "net.pt", "pt2", tmp_path / "b.pt2", verify=False, **spec)
    # the edited forward, not the first program from the cache
    torch.testing.assert_close(torch.export.load(tmp_path / "b.pt2").module()(x), plain * 3)
    assert not second.cached
    for report in (first, second):
        assert any("not part of the cache key" in n for n in report.notes), report.notes
    assert not (cache_dir / "entries").exists()  # neither read nor stored
    d = detect(tmp_path / "net.pt")
    inputs = cache_key.cache_key(d, "pt2", tmp_path / "c.pt2", Options())[1]
    assert "cached_net.Net" in inputs["imports_code"]  # what the key does not cover, said


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user's takes root")
def test_another_users_entry_is_neither_served_nor_replaced(
    filled: Path, cache_dir: Path, checkpoint: Path, tmp_path: Path
) -> None:
    """A hit is not scanned and its sha256 lies in its own complete.json: an entry another
    user made (or any file of it) is a miss, and left as it is."""
    entry = _use(filled, cache_dir)
    (artifact,) = (entry / "files").iterdir()
    before = {p: (p.stat().st_uid, p.read_bytes()) for p in (entry / "complete.json", artifact)}
    os.chown(entry, 12345, -1)
    try:
        report = ptconvert.convert(checkpoint, "pt2", tmp_path / "o.pt2", **SPEC)
        assert not report.cached and report.check == "parity"
        assert any(
            "owned by uid 12345" in n and "neither used nor replaced" in n for n in report.notes
        ), report.notes
        _computes_as_eager(tmp_path / "o.pt2", checkpoint)
        assert {p: (p.stat().st_uid, p.read_bytes()) for p in before} == before
        assert entry.stat().st_uid == 12345
        assert [e.name for e in (cache_dir / "entries").iterdir()] == [entry.name]
    finally:
        os.chown(entry, os.geteuid(), -1)
    # one file of it another user's: looked up as a conversion would, neither hit nor filled
    out = tmp_path / "slot.pt2"
    for planted in (entry / "complete.json", entry / "files", artifact):
        os.chown(planted, 12345, -1)
        try:
            with cache.cache_slot(detect(checkpoint), "pt2", out, Options(**SPEC)) as slot:
                assert slot.hit is None and not slot.filling and not out.exists()
                assert slot.note and f"{planted} is owned by uid 12345" in slot.note
        finally:
            os.chown(planted, os.geteuid(), -1)
    with cache.cache_slot(detect(checkpoint), "pt2", out, Options(**SPEC)) as slot:
        assert slot.hit is not None and slot.note is None  # all of it the user's again: a hit


def test_the_copy_out_places_files_together_and_sizes_come_from_disk_size(
    cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One way to do each thing: a multi-file output goes in place through
    ``atomic.place_together`` (companions first, the main file last, a replaced output's
    companion removed), sizes through ``atomic.disk_size``."""
    import hashlib

    from ptconvert import atomic
    from ptconvert.formats import FORMATS_BY_NAME

    entry = tmp_path / "entry"
    (entry / "files").mkdir(parents=True)
    stored = {"m.onnx": b"the graph", "m.onnx.data": b"the weights"}
    for name, data in stored.items():
        (entry / "files" / name).write_bytes(data)
    meta = {n: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in stored.items()}
    record = {"main": "m.onnx", "files": meta}
    placed: list[Any] = []

    def place(moves: Any, obsolete: Any = (), **how: Any) -> None:
        placed.append(([d.name for _, d in moves], [p.name for p in obsolete]))
        atomic.place_together(moves, obsolete, **how)

    monkeypatch.setattr(cache_store, "place_together", place)
    out = tmp_path / "out" / "m.onnx"
    cache_store.copy_out(entry, record, out, FORMATS_BY_NAME["onnx"])
    assert placed == [(["m.onnx.data", "m.onnx"], [])]
    assert {p.name: p.read_bytes() for p in out.parent.iterdir()} == stored  # no temporary left
    # a replaced output whose companion the stored one lacks; a corrupt file places nothing
    only_main = {"main": "m.onnx", "files": {"m.onnx": meta["m.onnx"]}}
    cache_store.copy_out(entry, only_main, out, FORMATS_BY_NAME["onnx"])
    assert placed[-1] == (["m.onnx"], ["m.onnx.data"])
    assert [p.name for p in out.parent.iterdir()] == ["m.onnx"]
    (entry / "files" / "m.onnx.data").write_bytes(b"the weightS")
    with pytest.raises(cache_store.Corrupt):
        cache_store.copy_out(entry, record, out, FORMATS_BY_NAME["onnx"])
    assert len(placed) == 2 and [p.name for p in out.parent.iterdir()] == ["m.onnx"]

    sized: list[Path] = []
    monkeypatch.setattr(cache_store, "disk_size", lambda p: sized.append(p) or atomic.disk_size(p))
    ptconvert.cache_info()
    assert sized == [cache_dir]


def test_a_directory_is_keyed_by_every_file_it_loads_from(tmp_path: Path) -> None:
    from types import SimpleNamespace

    (tmp_path / "sub").mkdir()
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "sub" / "model.safetensors").write_bytes(b"w")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "pack").write_bytes(b"a second copy of the weights")
    files = cache_key._source_files(SimpleNamespace(path=tmp_path))  # type: ignore[arg-type]
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

    monkeypatch.setattr(engine, "verify_program", differs)
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
    key = cache_key.cache_key(detect(checkpoint), "pt2", outs[0], Options(**SPEC))[0]
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


FAULTS = {  # how a cache folder is made unusable, and what the error says
    "read-only": (0o555, "read-only"),
    "another user": (None, "owned by uid 12345"),
    "entries read-only": (0o555, "read-only"),
    "writable by others": (0o777, "other users could plant programs there"),
    "tmp writable by others, sticky": (0o1777, "other users could plant programs there"),
    "entries writable by others": (0o707, "other users could plant programs there"),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_an_unusable_cache_directory_is_exit_12(
    fault: str, cache_dir: Path, checkpoint: Path, tmp_path: Path, capsys: Any
) -> None:
    mode, said = FAULTS[fault]
    folder = cache_dir
    if fault.startswith(("entries", "tmp")):
        folder = cache_dir / fault.split()[0]
        folder.mkdir()
    if mode is None:
        os.chown(folder, 12345, -1)
    else:
        folder.chmod(mode)
    try:
        out = tmp_path / "m.pt2"
        code = main([str(checkpoint), "--to", "pt2", "-o", str(out), *SPEC_ARGS])
        err = capsys.readouterr().err
        assert code == 12, err
        assert str(folder) in err and "--no-cache" in err and "Traceback" not in err
        assert said in err
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


def test_a_group_writable_cache_is_used(
    filled: Path, cache_dir: Path, checkpoint: Path, tmp_path: Path
) -> None:
    """Under umask 002 every folder is group-writable: accepted (each user a group of their
    own), unlike writable by others."""
    _use(filled, cache_dir)
    for folder in (cache_dir, *(cache_dir / n for n in ("entries", "locks", "tmp"))):
        folder.mkdir(exist_ok=True)
        folder.chmod(0o2775)
    report = ptconvert.convert(checkpoint, "pt2", tmp_path / "g.pt2", **SPEC)
    assert report.cached
    assert ptconvert.cache_info().problem is None


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
