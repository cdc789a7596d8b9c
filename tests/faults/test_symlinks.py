"""Symbolic link loops: in a Hugging Face directory a named error (exit 9) naming the link; in
a batch folder the loop is one failed item and the rest converts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.faults.conftest import checkpoint


def _loop(folder: Path) -> Path:
    (folder / "l1").symlink_to("l2")
    (folder / "l2").symlink_to("l1")
    return folder / "l1"


def test_a_link_loop_in_a_hugging_face_directory_is_named(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "bert"
    shutil.copytree(samples["hf_bert"], directory)
    link = _loop(directory)
    args = [str(directory), "--to", "safetensors", "-o", str(tmp_path / "out")]
    code, report, _ = run_cli(args, capsys)
    assert (code, report["error"]["kind"], report["error"]["path"]) == (
        9,
        "symlink_loop",
        str(link),
    )
    code, report, _ = run_cli(["info", str(link)], capsys)
    assert (code, report["error"]["kind"]) == (9, "symlink_loop")


def test_a_link_loop_in_a_batch_folder_fails_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zoo, out = tmp_path / "zoo", tmp_path / "out"
    zoo.mkdir()
    checkpoint(zoo / "m.pt")
    _loop(zoo)
    (zoo / "sub").mkdir()
    (zoo / "sub" / "up").symlink_to("..")  # a folder loop: each real folder is searched once
    args = [str(zoo), "--to", "safetensors", "-o", str(out), "--keep-going"]
    code, report, _ = run_cli(args, capsys)
    items = {i["src"]: (i["status"], (i["error"] or {}).get("kind")) for i in report["items"]}
    assert items == {
        "l1": ("failed", "symlink_loop"),
        "l2": ("failed", "symlink_loop"),
        "m.pt": ("converted", None),
    }
    assert code == 9 and (out / "m.safetensors").exists()
