"""The filesystem fails or differs: another filesystem, no space (before and while writing),
read-only, no permission, a file where a folder should be, the folder removed while writing.
Each is a named error (exit 9) naming the output, never the temporary path, or succeeds; nothing
is left behind."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

import ptconvert
from ptconvert import atomic
from ptconvert.errors import NoSpaceError
from ptconvert.formats import safetensors as write
from tests.conftest import run_cli
from tests.faults.conftest import REPO, checkpoint, cli, temporaries


def _error(code: int, report: Any, kind: str, path: Path) -> dict[str, Any]:
    assert code == 9, report
    error = report["error"]
    assert (error["kind"], error["path"]) == (kind, str(path)), error
    assert "ptconvert-tmp" not in error["message"]  # the output is named, not a temporary
    return dict(error)


@pytest.mark.parametrize("to", ["safetensors", "pt"])
def test_output_on_another_filesystem_is_written_and_verified(
    tmp_path: Path, mount: Any, capsys: pytest.CaptureFixture[str], to: str
) -> None:
    """copy_file_range cannot cross filesystems (EXDEV): the copy falls back, in the kernel."""
    src, there = checkpoint(tmp_path / "m.pt", 1), mount("other", "16m")
    out = there / f"m.{to}"
    code, report, _ = run_cli([str(src), "--to", to, "-o", str(out)], capsys)
    assert (code, report["check"]) == (0, "bitwise")
    assert os.listdir(there) == [out.name]


def test_a_hugging_face_directory_is_written_on_another_filesystem(
    samples: dict[str, Path], mount: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    out = mount("other", "16m") / "bert"
    code, report, _ = run_cli(
        [str(samples["hf_bert"]), "--to", "safetensors", "-o", str(out)], capsys
    )
    assert (code, report["check"]) == (0, "bitwise")
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    assert temporaries(out.parent) == []


def test_the_copy_falls_back_to_sendfile_then_to_reads_and_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Injected: the kernel copy refuses (EXDEV), then sendfile too (EINVAL)."""
    src = checkpoint(tmp_path / "m.pt", 0.5)
    used: list[str] = []

    def refuse(code: int, name: str) -> Any:
        def call(*args: Any) -> int:
            used.append(name)
            raise OSError(code, os.strerror(code))

        return call

    monkeypatch.setattr(os, "copy_file_range", refuse(errno.EXDEV, "copy_file_range"))
    assert ptconvert.convert(src, "safetensors", tmp_path / "a.safetensors").check == "bitwise"
    assert used == ["copy_file_range"] * 2  # one try per tensor, then sendfile did it
    monkeypatch.setattr(os, "sendfile", refuse(errno.EINVAL, "sendfile"))
    assert ptconvert.convert(src, "pt", tmp_path / "b.pt").check == "bitwise"
    assert "sendfile" in used


def test_no_space_is_said_before_writing_with_the_bytes_needed(
    tmp_path: Path, mount: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    src, small = checkpoint(tmp_path / "m.pt", 1), mount("small", "256k")
    out = small / "m.safetensors"
    code, report, _ = run_cli([str(src), "--to", "safetensors", "-o", str(out)], capsys)
    error = _error(code, report, "no_space", out)
    assert "needs 1,048" in error["message"] and "are free" in error["message"]
    assert os.listdir(small) == []


@pytest.mark.parametrize("to", ["safetensors", "pt"])
def test_no_space_while_writing_is_a_named_error_and_leaves_nothing(
    tmp_path: Path,
    mount: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    to: str,
) -> None:
    """The free space was there when the write began (another process took it meanwhile)."""
    monkeypatch.setattr(write, "ensure_space", lambda *a, **k: None)
    monkeypatch.setattr("ptconvert.formats.torch_zip.ensure_space", lambda *a, **k: None)
    src, small = checkpoint(tmp_path / "m.pt", 1), mount("small", "256k")
    out = small / f"m.{to}"
    code, report, _ = run_cli([str(src), "--to", to, "-o", str(out)], capsys)
    _error(code, report, "no_space", out)
    assert os.listdir(small) == []


def test_no_space_injected_is_a_named_error_from_the_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "copy_file_range", full)
    src, out = checkpoint(tmp_path / "m.pt"), tmp_path / "out" / "m.safetensors"
    with pytest.raises(NoSpaceError) as caught:
        ptconvert.convert(src, "safetensors", out)
    assert caught.value.path == str(out) and caught.value.exit_code == 9
    assert not out.parent.exists()  # nothing left: not even the folder made for it


_PT2 = """
import resource, signal, sys
import ptconvert.convert.engine as engine
engine._check_space = lambda route, out: None  # the estimate passed: the write itself fails
if sys.argv[1] == "fsize":  # no tmpfs: the file size limit fails the write the same way
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
from ptconvert.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _factory(tmp_path: Path) -> tuple[Path, list[str]]:
    (tmp_path / "net.py").write_text(
        "import torch\n\ndef make():\n    return torch.nn.Linear(300, 300)\n"
    )
    src = tmp_path / "w.pt"
    import torch

    torch.manual_seed(0)
    torch.save(torch.nn.Linear(300, 300).state_dict(), src)
    return src, ["--model", f"{tmp_path / 'net.py'}:make", "--input", "input:2x300:float32"]


def _pt2_failing_write(how: str, src: Path, out: Path, spec: list[str]) -> tuple[int, str]:
    done = subprocess.run(
        [
            sys.executable,
            "-B",
            "-c",
            _PT2,
            how,
            str(src),
            "--to",
            "pt2",
            "-o",
            str(out),
            "--no-cache",
            *spec,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stderr


def test_a_pt2_write_that_runs_out_of_space_is_an_error_not_an_abort(
    tmp_path: Path, mount: Any
) -> None:
    """torch's zip writer aborts the process (SIGABRT) when a write fails: it writes into a
    Python file object that keeps the failure from it."""
    src, spec = _factory(tmp_path)
    small = mount("small", "200k")
    code, err = _pt2_failing_write("tmpfs", src, small / "m.pt2", spec)
    assert code == 9, err  # not -6 (SIGABRT)
    assert f"{small / 'm.pt2'}: no space left on the device" in err
    assert os.listdir(small) == []


def test_a_pt2_write_past_the_file_size_limit_is_an_error_not_an_abort(tmp_path: Path) -> None:
    src, spec = _factory(tmp_path)
    out = tmp_path / "out" / "m.pt2"
    code, err = _pt2_failing_write("fsize", src, out, spec)
    assert code == 9, err
    assert f"{out}: the file is larger than this filesystem allows" in err
    assert not out.parent.exists()  # nothing left: not even the folder made for it


def test_a_pt2_without_room_for_its_weights_is_refused_before_the_work(
    tmp_path: Path, mount: Any
) -> None:
    src, spec = _factory(tmp_path)
    out = mount("small", "200k") / "m.pt2"
    run = cli(str(src), "--to", "pt2", "-o", str(out), *spec)  # an abort would end pytest
    said, _ = run.communicate(timeout=300)
    error = _error(run.returncode, json.loads(said), "no_space", out)
    assert "needs about 361,200 bytes" in error["message"]


def test_a_read_only_destination_names_the_output(
    tmp_path: Path, mount: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    src, out = checkpoint(tmp_path / "m.pt"), mount("ro", ro=True) / "m.safetensors"
    code, report, _ = run_cli([str(src), "--to", "safetensors", "-o", str(out)], capsys)
    _error(code, report, "read_only", out)
    code, report, _ = run_cli(
        [str(src), "--to", "safetensors", "-o", str(out.parent / "sub" / "m.st")], capsys
    )
    _error(code, report, "read_only", out.parent / "sub")  # the folder it cannot create


@pytest.mark.parametrize(
    ("code", "kind"), [(errno.EROFS, "read_only"), (errno.EACCES, "permission_denied")]
)
def test_a_folder_that_refuses_writes_names_the_output(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    code: int,
    kind: str,
) -> None:
    """Injected (root passes chmod): creating the temporary folder fails, naming itself."""

    def refuse(prefix: str = "", suffix: str = "", dir: str = "") -> str:
        raise OSError(code, os.strerror(code), os.path.join(dir, f"{prefix}x{suffix}"))

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    src, out = checkpoint(tmp_path / "m.pt"), tmp_path / "m.safetensors"
    got, report, _ = run_cli([str(src), "--to", "safetensors", "-o", str(out)], capsys)
    _error(got, report, kind, out)


def test_an_output_below_a_regular_file_names_that_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, blocking = checkpoint(tmp_path / "m.pt"), tmp_path / "afile"
    blocking.write_text("not a folder")
    for out in (blocking / "m.safetensors", blocking / "deeper" / "m.safetensors"):
        code, report, _ = run_cli([str(src), "--to", "safetensors", "-o", str(out)], capsys)
        assert (
            "is a file, not a folder" in _error(code, report, "not_a_folder", blocking)["message"]
        )


def test_the_folder_removed_while_writing_is_a_named_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    publish = atomic.publish

    def removed_first(src: Path, dst: Path, *, replace: bool) -> None:
        import shutil

        shutil.rmtree(dst.parent)
        publish(src, dst, replace=replace)

    monkeypatch.setattr(atomic, "publish", removed_first)
    src, out = checkpoint(tmp_path / "m.pt"), tmp_path / "gone" / "m.safetensors"
    code, report, _ = run_cli([str(src), "--to", "safetensors", "-o", str(out)], capsys)
    _error(code, report, "missing_folder", out)


def test_an_aoti_package_write_that_runs_out_of_space_is_a_named_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The filesystem failing under AOTInductor's packaging is exit 9 naming the output, not
    'AOTInductor cannot compile this program' (exit 4)."""
    import torch._inductor

    def no_space(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", no_space)
    src, spec = _factory(tmp_path)
    out = tmp_path / "net.pt2"
    code, report, _ = run_cli([str(src), "--to", "aoti", "-o", str(out), *spec], capsys)
    _error(code, report, "no_space", out)
    assert not out.exists() and temporaries(tmp_path) == []


@pytest.mark.parametrize("to", ["safetensors", "pt"])
def test_the_written_weights_start_to_disk_while_the_check_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, to: str
) -> None:
    """``cmd && sync`` after a 1 GiB conversion wrote the whole file after the conversion; the
    writes now start as soon as the file is written (``sync_file_range``), beside the check."""
    src = checkpoint(tmp_path / "m.pt", 1)
    started: list[tuple[list[Path], bool]] = []
    real = atomic.start_writeback

    def recorded(paths: list[Path]) -> Any:
        started.append(([Path(p) for p in paths], all(Path(p).stat().st_size for p in paths)))
        return real(paths)

    monkeypatch.setattr(atomic, "start_writeback", recorded)
    out = tmp_path / ("m.safetensors" if to == "safetensors" else "back.pt")
    ptconvert.convert(src, to, out)
    ((paths, complete),) = started
    assert [p.name for p in paths] == [out.name] and complete  # the finished file, staged
    assert "ptconvert-tmp" in str(paths[0].parent)
    # the call itself: a thread that submits the writes and ends; a file gone meanwhile is no
    # error (the staged folder is removed when a run fails)
    thread = real([out, tmp_path / "gone.safetensors"])
    if thread is not None:  # Linux: sync_file_range
        thread.join(10)
        assert not thread.is_alive()
    assert ptconvert.verify(src, out).status == "pass"
