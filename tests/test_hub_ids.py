"""Hugging Face Hub ids as sources (ptconvert/hub.py), resolved in a Hub cache built here in the
layout huggingface_hub writes (``models--owner--name/refs``, ``snapshots/<commit>/`` whose files
link to ``blobs/<sha256>``), with HF_HUB_OFFLINE=1: nothing is downloaded."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

import ptconvert
from ptconvert.cli import main
from ptconvert.hub import parse_id, snapshot_of
from tests.conftest import run_cli

MAIN = "a" * 40  # the commit refs/main names
V2 = "b" * 40  # the commit of the branch v2: other weights
EVIL = "c" * 40  # the commit of the branch evil: a dangerous pickle beside the model


def _snapshot(repo: Path, ref: str, commit: str, files: dict[str, bytes]) -> Path:
    """One snapshot as huggingface_hub writes it: each file a relative link to its blob."""
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name, data in files.items():
        sha = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / sha).write_bytes(data)
        (snapshot / name).symlink_to(Path("../../blobs") / sha)
    return snapshot


def _doubled(weights: bytes) -> bytes:
    """The same safetensors file with every tensor doubled."""
    from safetensors.torch import load, save

    return save({k: v * 2 for k, v in load(weights).items()}, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hub cache holding acme/tiny-gpt2 (a tiny GPT-2 saved by transformers) at main, v2
    (other weights) and evil (a pickle that would run os.system)."""
    from fixtures.scan_corpus import raw_techniques
    from tests.generation.conftest import build

    model = build("gpt2", tmp_path_factory.mktemp("model"))
    files = {p.name: p.read_bytes() for p in model.iterdir() if p.is_file()}
    cache = tmp_path_factory.mktemp("hub")
    repo = cache / "models--acme--tiny-gpt2"
    _snapshot(repo, "main", MAIN, files)
    _snapshot(repo, "v2", V2, {**files, "model.safetensors": _doubled(files["model.safetensors"])})
    evil = raw_techniques(tmp_path_factory.mktemp("marker") / "RAN")["os_system_p2"]
    _snapshot(repo, "evil", EVIL, {**files, "extra.pkl": evil})
    return cache


@pytest.fixture
def offline(hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HF_HUB_OFFLINE=1, HF_HUB_CACHE the cache above, the current folder an empty one."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _tensors(path: Path) -> dict[str, bytes]:
    from safetensors.torch import load_file

    return {k: v.numpy().tobytes() for k, v in load_file(path).items()}


def test_ids_are_read_as_huggingface_hub_names_them() -> None:
    assert parse_id("acme/tiny-gpt2") == ("acme/tiny-gpt2", None)
    assert parse_id("hf://acme/tiny-gpt2@v2") == ("acme/tiny-gpt2", "v2")
    assert parse_id("hf://gpt2") == ("gpt2", None)
    for not_an_id in ("gpt2", "model.bin", "a/b/c", "./acme/x", "/acme/x", "acme/-x", "a/x."):
        assert parse_id(not_an_id) is None, not_an_id


def test_convert_by_id_writes_in_the_current_folder_checked_bitwise(
    offline: Path, hub: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["acme/tiny-gpt2", "--to", "safetensors"], capsys)
    assert code == 0, err
    assert out["check"] == "bitwise"
    written = offline / "tiny-gpt2-safetensors"  # not beside the snapshot, inside the cache
    assert Path(out["output"]).resolve() == written
    snapshot = hub / "models--acme--tiny-gpt2" / "snapshots" / MAIN
    assert any("acme/tiny-gpt2" in n and str(snapshot) in n for n in out["notes"])
    assert _tensors(written / "model.safetensors") == _tensors(snapshot / "model.safetensors")
    assert not list(hub.glob("**/*-safetensors"))


def test_revision_picks_another_snapshot(offline: Path, hub: Path) -> None:
    report = ptconvert.convert("hf://acme/tiny-gpt2", "safetensors", revision="v2")
    v2 = hub / "models--acme--tiny-gpt2" / "snapshots" / V2
    assert report.check == "bitwise"
    assert str(v2) in report.notes[0] and "revision v2" in report.notes[0]
    written = _tensors(Path(report.output) / "model.safetensors")
    assert written == _tensors(v2 / "model.safetensors")
    assert written != _tensors(v2.parent / MAIN / "model.safetensors")


def test_info_by_id_with_cache_dir(
    hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # empty: --cache-dir says where it is
    code, out, err = run_cli(["info", "acme/tiny-gpt2", "--cache-dir", str(hub)], capsys)
    assert code == 0, err
    assert out["format"] == "hf"
    assert out["path"].endswith(f"snapshots/{MAIN}")
    assert any("acme/tiny-gpt2 at revision main" in n for n in out["notes"])
    described = ptconvert.describe("hf://acme/tiny-gpt2@v2", cache_dir=hub)
    assert described.path.endswith(f"snapshots/{V2}")


def test_plan_and_verify_take_ids(offline: Path) -> None:
    plan = ptconvert.plan("acme/tiny-gpt2", "safetensors")
    assert plan.source.endswith(MAIN) and "acme/tiny-gpt2" in plan.notes[0]
    out = ptconvert.convert("acme/tiny-gpt2", "safetensors").output
    report = ptconvert.verify("acme/tiny-gpt2", out)
    assert report.status == "pass"
    assert any("acme/tiny-gpt2" in n for n in report.notes)


def test_scan_by_id_follows_the_links_and_names_the_snapshot_files(
    offline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(["scan", "acme/tiny-gpt2", "--revision", "evil"], capsys)
    assert code == 10
    assert out["verdict"] == "dangerous"
    bad = [f for f in out["files"] if f["verdict"] == "dangerous"]
    assert [Path(f["path"]).name for f in bad] == ["extra.pkl"]
    assert f"snapshots/{EVIL}/extra.pkl" in bad[0]["path"]  # its snapshot name, not its blob
    assert any(f["path"].endswith("model.safetensors") for f in out["files"])
    assert "acme/tiny-gpt2 at revision evil" in out["notes"][0]


def test_an_unknown_id_names_the_id_the_cache_and_the_revision(
    offline: Path, hub: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(["acme/nope", "--to", "safetensors", "--revision", "v9"], capsys)
    error = out["error"]
    assert code == 3 and error["kind"] == "hub_model_not_found"
    assert error["path"] == "acme/nope"
    assert str(hub) in error["message"] and "revision v9" in error["message"]
    assert "huggingface-cli download acme/nope --revision v9" in error["hint"]
    assert main(["info", "hf://acme/tiny-gpt2@nobranch"]) == 3
    assert "nobranch" in capsys.readouterr().err


def test_a_local_folder_named_like_an_id_wins(offline: Path, hub: Path) -> None:
    local = offline / "acme" / "tiny-gpt2"
    shutil.copytree(hub / "models--acme--tiny-gpt2" / "snapshots" / V2, local, symlinks=False)
    info = ptconvert.describe("acme/tiny-gpt2")
    assert info.path == "acme/tiny-gpt2" and not any("revision" in n for n in info.notes)
    # a missing file in a folder that is here is a missing file, not an id
    with pytest.raises(ptconvert.errors.InputError, match="no such file") as caught:
        ptconvert.describe("acme/model.bin")
    assert caught.value.kind != "hub_model_not_found"
    with pytest.raises(ptconvert.errors.InputError, match="no such file") as caught:
        ptconvert.describe("elsewhere/model.safetensors")  # a model file's name: never an id
    assert caught.value.kind != "hub_model_not_found"


def test_outputs_of_a_snapshot_given_as_a_path_go_to_the_current_folder(
    offline: Path, hub: Path
) -> None:
    snapshot = hub / "models--acme--tiny-gpt2" / "snapshots" / MAIN
    assert snapshot_of(snapshot / "config.json") == (snapshot, "tiny-gpt2")
    assert snapshot_of(hub) is None
    report = ptconvert.convert(snapshot, "safetensors")
    assert Path(report.output) == Path("tiny-gpt2-safetensors")


def test_onnx_external_data_linked_to_its_blob_stays_inside(tmp_path: Path) -> None:
    """In the cache a model's external data file links to a blob: not outside its folder."""
    from ptconvert.scan.containers import _escapes

    repo = tmp_path / "models--acme--onnx"
    snapshot = _snapshot(repo, "main", MAIN, {"model.onnx_data": b"\0" * 8})
    assert not _escapes(snapshot.resolve(), "model.onnx_data")
    (snapshot / "secret").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_bytes(b"x")
    assert _escapes(snapshot.resolve(), "secret")
    assert _escapes(snapshot.resolve(), "../../blobs/" + hashlib.sha256(b"\0" * 8).hexdigest())
