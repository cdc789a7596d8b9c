"""No silent replacement: without --force, an output another process wrote while this run was
converting is kept and this run fails (exit 8); two writers of one path never both succeed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ptconvert import atomic
from ptconvert.errors import OutputExistsError
from tests.conftest import run_cli
from tests.faults.conftest import checkpoint, cli, temporaries


def test_a_file_written_meanwhile_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "m.safetensors"
    with pytest.raises(OutputExistsError), atomic.atomic_path(out) as tmp:
        tmp.write_bytes(b"mine")
        out.write_bytes(b"theirs")  # another process publishes first
    assert out.read_bytes() == b"theirs" and temporaries(tmp_path) == []
    with atomic.atomic_path(out, replace=True) as tmp:  # --force
        tmp.write_bytes(b"mine")
    assert out.read_bytes() == b"mine" and temporaries(tmp_path) == []


def test_a_folder_written_meanwhile_is_kept_and_replaced_whole_with_force(tmp_path: Path) -> None:
    out = tmp_path / "model-safetensors"
    with pytest.raises(OutputExistsError), atomic.atomic_path(out, directory=True) as tmp:
        (tmp / "mine").write_text("1")
        out.mkdir()  # even an empty folder: a rename would silently replace it
    assert os.listdir(out) == [] and temporaries(tmp_path) == []
    (out / "old").write_text("0")
    with atomic.atomic_path(out, directory=True, replace=True) as tmp:
        (tmp / "mine").write_text("1")
    assert os.listdir(out) == ["mine"] and temporaries(tmp_path) == []


def test_a_conversion_whose_output_appears_meanwhile_fails_with_exit_8(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ptconvert.convert import weights

    verify = weights.verify_weights
    src, out = checkpoint(tmp_path / "m.pt"), tmp_path / "out" / "m.safetensors"

    def other_writer_first(*args: Any, **kwargs: Any) -> Any:
        out.write_bytes(b"the other process's output")
        return verify(*args, **kwargs)

    monkeypatch.setattr(weights, "verify_weights", other_writer_first)
    code, report, _ = run_cli([str(src), "--to", "safetensors", "-o", str(out)], capsys)
    assert (code, report["error"]["path"]) == (8, str(out))
    assert out.read_bytes() == b"the other process's output"
    assert os.listdir(out.parent) == [out.name]


def test_two_processes_writing_one_output_never_both_succeed(tmp_path: Path) -> None:
    src, out = checkpoint(tmp_path / "m.pt", 64), tmp_path / "out" / "m.safetensors"
    runs = [cli(str(src), "--to", "safetensors", "-o", str(out)) for _ in range(2)]
    codes = sorted(r.wait() for r in runs)
    assert codes == [0, 8], [r.communicate() for r in runs]
    assert os.listdir(out.parent) == [out.name]


def test_companions_placed_for_an_output_that_cannot_be_published_are_taken_back(
    tmp_path: Path,
) -> None:
    staged = tmp_path / "staged"
    staged.mkdir()
    for name in ("m.onnx.data", "m.onnx"):
        (staged / name).write_text(name)
    (tmp_path / "m.onnx").write_text("theirs")
    moves = [(staged / n, tmp_path / n) for n in ("m.onnx.data", "m.onnx")]
    with pytest.raises(OutputExistsError):
        atomic.place_together(moves, replace=False)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "staged"]
    assert (tmp_path / "m.onnx").read_text() == "theirs"


def test_an_output_folder_that_holds_the_input_is_never_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-o`` the input's own folder with --force (sharded output): replacing the folder would
    delete the input and everything beside it; refused (exit 2), nothing touched."""
    folder = tmp_path / "work"
    folder.mkdir()
    src = checkpoint(folder / "model.pt", megabytes=0.05)
    (folder / "notes.txt").write_text("keep")
    argv = [str(src), "--to", "safetensors", "--max-shard-size", "20KB", "-o", str(folder)]
    code, report, _ = run_cli([*argv, "--force"], capsys)
    assert code == 2 and "holds the input" in report["error"]["message"], report
    assert src.exists() and (folder / "notes.txt").read_text() == "keep"
