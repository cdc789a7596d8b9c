"""Inputs that inflate far past their size, memory that runs out, and legacy tar checkpoints in
any member order: named errors (``decompression_limit`` exit 3, ``out_of_memory`` exit 13),
never ``internal error``; ``info`` says what ``convert`` refuses."""

from __future__ import annotations

import io
import itertools
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import ptconvert
from fixtures.build import write_legacy_tar
from ptconvert.errors import OutOfMemoryError
from tests.conftest import run_cli


def _said(report: dict[str, Any]) -> tuple[str, str]:
    return report["error"]["kind"], report["error"]["path"]


def _deflated(path: Path, state: dict[str, torch.Tensor]) -> Path:
    """A torch zip whose members are deflated (a checkpoint re-zipped by some tool)."""
    stored = path.with_suffix(".stored")
    torch.save(state, stored)
    with zipfile.ZipFile(stored) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    stored.unlink()
    return path


def test_a_storage_that_inflates_a_thousandfold_is_refused_and_info_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bomb = _deflated(tmp_path / "bomb.pt", {"w": torch.zeros(16 << 20), "b": torch.ones(3)})
    assert bomb.stat().st_size < 200_000  # 64 MiB of storage
    out = tmp_path / "bomb.safetensors"
    code, report, _ = run_cli([str(bomb), "--to", "safetensors", "-o", str(out)], capsys)
    assert (code, report["error"]["kind"]) == (3, "decompression_limit")
    assert "past the 200-fold limit" in report["error"]["message"] and not out.exists()
    code, report, _ = run_cli(["info", str(bomb)], capsys)
    assert code == 0
    assert any("200-fold limit" in n and "convert refuses it" in n for n in report["notes"])


def test_a_deflated_checkpoint_within_the_limits_converts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = {"w": torch.randn(1 << 18), "b": torch.ones(3)}
    src, out = _deflated(tmp_path / "m.pt", state), tmp_path / "m.safetensors"
    code, report, _ = run_cli([str(src), "--to", "safetensors", "-o", str(out)], capsys)
    assert (code, report["check"]) == (0, "bitwise")
    assert torch.equal(load_file(out)["w"], state["w"])


def test_memory_too_small_for_a_storage_is_out_of_memory_not_a_corrupt_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("ptconvert.memory.available_bytes", lambda: 1 << 20)
    src = _deflated(tmp_path / "m.pt", {"w": torch.randn(1 << 20)})
    code, report, _ = run_cli([str(src), "--to", "safetensors"], capsys)
    assert (code, report["error"]["kind"], report["error"]["path"]) == (
        13,
        "out_of_memory",
        str(src),
    )


def test_a_memory_error_anywhere_is_out_of_memory_naming_the_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def exhausted(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr("ptconvert.model.build.read_weights", exhausted)
    src = tmp_path / "m.pt"
    torch.save({"w": torch.ones(3)}, src)
    code, report, _ = run_cli([str(src), "--to", "safetensors"], capsys)
    assert (code, report["error"]["kind"], report["error"]["path"]) == (
        13,
        "out_of_memory",
        str(src),
    )
    with pytest.raises(OutOfMemoryError):
        ptconvert.convert(src, "safetensors", tmp_path / "x.safetensors")


def test_info_says_when_a_member_is_past_the_scan_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a data.pkl of 2 GiB: the limit is archive's, read by info and by the scanner's reader
    monkeypatch.setattr("ptconvert.archive.MAX_INFLATED", 64)
    monkeypatch.setattr("ptconvert.scan.containers.MAX_INFLATED", 64)
    src = tmp_path / "m.pt"
    torch.save({f"w{i}": torch.ones(1) for i in range(8)}, src)
    code, report, _ = run_cli(["info", str(src)], capsys)
    assert code == 0
    assert any("data.pkl" in n and "convert refuses the file" in n for n in report["notes"])
    code, report, _ = run_cli([str(src), "--to", "safetensors"], capsys)
    assert code == 3 and "scan limit" in report["error"]["message"]


def test_the_scan_running_out_of_memory_is_out_of_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import errno
    import mmap

    def no_memory(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", no_memory)
    src = tmp_path / "m.pt"
    torch.save({"w": torch.ones(3)}, src, _use_new_zipfile_serialization=False)
    code, report, _ = run_cli([str(src), "--to", "safetensors"], capsys)
    assert (code, report["error"]["kind"]) == (13, "out_of_memory")


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


def _tar(path: Path, members: dict[str, bytes], order: tuple[str, ...]) -> Path:
    with tarfile.open(path, "w:", format=tarfile.GNU_FORMAT) as tar:
        for name in order:
            info = tarfile.TarInfo(name)
            info.size = len(members[name])
            tar.addfile(info, io.BytesIO(members[name]))
    return path


def test_a_legacy_tar_in_any_member_order_and_without_sys_info_converts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = {"a": torch.randn(3, 4), "b": torch.randn(5)}
    write_legacy_tar(tmp_path / "ordered.pt", state)
    members = _members(tmp_path / "ordered.pt")
    orders = [*itertools.permutations(members), ("storages", "tensors", "pickle")]
    for i, order in enumerate(orders):
        src = _tar(tmp_path / f"t{i}.pt", members, order)
        out = tmp_path / f"t{i}.safetensors"
        code, report, _ = run_cli([str(src), "--to", "safetensors", "-o", str(out)], capsys)
        assert (code, report.get("check")) == (0, "bitwise"), (order, report)
        assert all(torch.equal(load_file(out)[k], v) for k, v in state.items())
