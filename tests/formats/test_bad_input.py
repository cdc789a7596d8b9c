"""Every kind of bad input gets its own message and exit code, through the CLI."""

from __future__ import annotations

import json
import shutil
import struct
import zipfile
from pathlib import Path

import pytest

from ptconvert.errors import CorruptFileError, InputError, TruncatedFileError
from tests.conftest import run_cli


def _safetensors(path: Path, header: bytes, data: bytes = b"", length: int | None = None) -> Path:
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)
    return path


def _expect(capsys: pytest.CaptureFixture[str], path: Path, kind: str, words: str) -> dict:
    code, out, _ = run_cli(["info", str(path)], capsys)
    err = out["error"]
    assert code == 3 == err["exit_code"]
    assert err["kind"] == kind
    assert err["path"] == str(path)
    assert words in err["message"]
    return err


def test_empty_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.bin").write_bytes(b"")
    _expect(capsys, tmp_path / "m.bin", "empty_file", "empty")


def test_zero_filled_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.bin").write_bytes(b"\0" * 4096)
    _expect(capsys, tmp_path / "m.bin", "empty_file", "zero bytes")


def test_git_lfs_pointer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "model.safetensors"
    p.write_text(
        "version https://git-lfs.github.com/spec/v1\n"
        "oid sha256:4d7a2146b8b5e6f3b0e3a1f7c2d9e8b1a0c3d4e5f60718293a4b5c6d7e8f9012\nsize 1024\n"
    )
    err = _expect(capsys, p, "lfs_pointer", "Git LFS pointer")
    assert "git lfs pull" in err["hint"]


def test_html_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "pytorch_model.bin"
    p.write_text("<!DOCTYPE html>\n<html><head><title>Sign in</title></head></html>")
    _expect(capsys, p, "html_page", "HTML page")


def test_truncated_zip_checkpoint(samples: dict[str, Path], tmp_path: Path, capsys) -> None:
    data = samples["mlp_zip"].read_bytes()
    p = tmp_path / "cut.pt"
    p.write_bytes(data[: len(data) // 2])
    _expect(capsys, p, "truncated", "truncated")


def test_truncated_raw_pickle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pickle

    p = tmp_path / "cut.pkl"
    p.write_bytes(pickle.dumps({"a": list(range(100))}, protocol=4)[:-20])
    _expect(capsys, p, "truncated", "cannot be parsed")


def test_truncated_safetensors_data(samples: dict[str, Path], tmp_path: Path, capsys) -> None:
    data = samples["cnn_safetensors"].read_bytes()
    p = tmp_path / "cut.safetensors"
    p.write_bytes(data[:-100])
    _expect(capsys, p, "truncated", "truncated")


def test_safetensors_header_longer_than_file(tmp_path: Path, capsys) -> None:
    p = _safetensors(tmp_path / "m.safetensors", b'{"a": 1}', length=10_000)
    _expect(capsys, p, "truncated", "runs past the end of the file")


def test_safetensors_header_of_several_gigabytes(tmp_path: Path, capsys) -> None:
    p = _safetensors(tmp_path / "m.safetensors", b'{"a": 1}', length=6 * 1024**3)
    _expect(capsys, p, "corrupt", "above the")


def test_safetensors_header_invalid_json(tmp_path: Path, capsys) -> None:
    p = _safetensors(tmp_path / "m.safetensors", b'{"a": [1, 2')
    _expect(capsys, p, "corrupt", "not valid JSON")


def test_safetensors_overlapping_tensors(tmp_path: Path, capsys) -> None:
    header = json.dumps(
        {
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
        }
    ).encode()
    p = _safetensors(tmp_path / "m.safetensors", header, b"\0" * 12)
    _expect(capsys, p, "corrupt", "overlap")


def test_zip_without_recognisable_members(tmp_path: Path, capsys) -> None:
    p = tmp_path / "model.pt"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("readme.txt", "hello")
        z.writestr("weights/blob", b"\1\2\3")
    err = _expect(capsys, p, "unknown_format", "no recognisable members")
    assert "readme.txt" in err["message"]


def test_directory_without_weights(tmp_path: Path, capsys) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    err = _expect(capsys, tmp_path, "no_weights", "no model weights")
    assert "config.json" in err["message"]


def test_unknown_bytes_list_what_was_seen(tmp_path: Path, capsys) -> None:
    p = tmp_path / "model.bin"
    p.write_bytes(b"XQZW\x03\x00\x00\x00" + b"\x01" * 100)
    err = _expect(capsys, p, "unknown_format", "first bytes 58 51 5a 57")
    assert "safetensors" in err["message"] and "onnx" in err["message"]


def test_missing_shard(samples: dict[str, Path], tmp_path: Path, capsys) -> None:
    folder = tmp_path / "set"
    shutil.copytree(samples["block_sharded_safetensors"].parent, folder)
    next(folder.glob("model-00002-*")).unlink()
    _expect(capsys, folder / "model.safetensors.index.json", "truncated", "missing")


@pytest.mark.parametrize("kind", ["safetensors", "bin"])
def test_a_missing_or_foreign_shard_stops_the_conversion_naming_it(
    kind: str, samples: dict[str, Path], tmp_path: Path, capsys
) -> None:
    """Converting a set whose index names a shard that is gone, or one that holds something else,
    is a corrupt input (exit 3) naming the file, not a missing output folder."""
    folder = tmp_path / "set"
    shutil.copytree(samples[f"block_sharded_{kind}"].parent, folder)
    index = next(folder.glob("*.index.json"))
    second = next(folder.glob("*-00002-*"))
    second.unlink()
    code, out, _ = run_cli([str(index), "--to", "safetensors", "-o", str(tmp_path / "o")], capsys)
    assert (code, out["error"]["kind"], out["error"]["path"]) == (3, "truncated", str(index))
    assert second.name in out["error"]["message"]
    second.write_bytes(b"garbage, not a checkpoint" * 8)
    code, out, _ = run_cli([str(index), "--to", "safetensors", "-o", str(tmp_path / "o")], capsys)
    assert code == 3 and second.name in out["error"]["path"] + out["error"]["message"], out
    assert not (tmp_path / "o").exists()


def test_missing_path(tmp_path: Path, capsys) -> None:
    _expect(capsys, tmp_path / "nope.pt", "bad_input", "no such file")


def test_human_error_names_file_without_traceback(tmp_path: Path, capsys) -> None:
    from ptconvert.cli import main

    p = tmp_path / "m.bin"
    p.write_bytes(b"")
    assert main(["info", str(p)]) == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"error: {p}: the file is empty")
    assert "Traceback" not in err


def test_error_classes_carry_their_codes() -> None:
    assert issubclass(TruncatedFileError, InputError)
    assert issubclass(CorruptFileError, InputError)
    assert TruncatedFileError("x").exit_code == 3
