"""A folder of models converted at once: -j N local processes or Ray tasks, one summary, an exit
code, a re-run that skips what is complete. Outputs are read back with safetensors' own reader."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from ptconvert.convert.batch_discovery import models_under
from ptconvert.convert.batch_manifest import MANIFEST
from tests.conftest import run_cli

REPO = Path(__file__).resolve().parents[2]
PTCONVERT = [sys.executable, "-m", "ptconvert"]
MLP_ARGS = ["--model", "fixtures.models:MLP", "--input", "x:2x8:float32", "--dynamic-batch"]


def _zoo(samples: dict[str, Path], root: Path, broken: str = "broken.pt") -> Path:
    """Three checkpoints (one truncated), a nested folder, a README that is not a model."""
    zoo = root / "zoo"
    (zoo / "sub").mkdir(parents=True)
    shutil.copy(samples["mlp_zip"], zoo / "a.pt")
    shutil.copy(samples["mlp_legacy"], zoo / "sub" / "b.pt")
    (zoo / broken).write_bytes(samples["mlp_zip"].read_bytes()[:3000])
    (zoo / "README.md").write_text("the MLP's weights, three times\n")
    return zoo


def _statuses(report: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {i["src"]: (i["status"], i["check"]) for i in report["items"]}


def _same_tensors(src: Path, out: Path) -> None:
    expected = torch.load(src, weights_only=True)
    with safe_open(out, "pt") as f:
        assert set(f.keys()) == set(expected)
        for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            assert torch.equal(f.get_tensor(name), expected[name]), name


def test_a_folder_is_converted_in_two_processes_and_the_broken_file_reported(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zoo, out = _zoo(samples, tmp_path), tmp_path / "out"
    code, report, _ = run_cli(
        [str(zoo), "--to", "safetensors", "-o", str(out), "-j", "2", "--keep-going"], capsys
    )
    assert code == 3  # the broken file's exit code: unreadable input
    assert _statuses(report) == {
        "a.pt": ("converted", "bitwise"),
        "broken.pt": ("failed", "none"),
        "sub/b.pt": ("converted", "bitwise"),
    }
    assert report["counts"] == {"converted": 2, "skipped": 0, "failed": 1, "not-run": 0}
    broken = next(i for i in report["items"] if i["src"] == "broken.pt")
    assert broken["error"]["path"].endswith("broken.pt")
    assert "cannot read this file completely" in broken["error"]["message"]
    _same_tensors(zoo / "a.pt", out / "a.safetensors")
    _same_tensors(zoo / "sub" / "b.pt", out / "sub" / "b.safetensors")
    assert not (out / "broken.safetensors").exists()
    here = f"{socket.gethostname()}:{os.getpid()}"
    workers = {i["worker"] for i in report["items"] if i["status"] == "converted"}
    assert workers and here not in workers  # converted in other processes
    assert sorted(p.name for p in out.iterdir()) == sorted([MANIFEST, "a.safetensors", "sub"])


def test_a_rerun_skips_what_is_complete_and_converts_what_changed(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zoo, out = _zoo(samples, tmp_path), tmp_path / "out"
    args = [str(zoo), "--to", "safetensors", "-o", str(out), "--keep-going"]
    assert run_cli(args, capsys)[0] == 3
    stamp = (out / "sub" / "b.safetensors").stat().st_mtime_ns

    code, report, _ = run_cli(args, capsys)
    assert code == 3
    assert _statuses(report)["a.pt"] == ("skipped", "bitwise")
    assert _statuses(report)["sub/b.pt"] == ("skipped", "bitwise")
    assert (out / "sub" / "b.safetensors").stat().st_mtime_ns == stamp  # not touched

    # new weights in a.pt: converted again over this batch's own output (no --force needed);
    # a deleted output is written again; b.pt stays as it was
    torch.save({k: v + 1 for k, v in torch.load(zoo / "a.pt").items()}, zoo / "a.pt")
    (tmp_path / "out" / "sub" / "b.safetensors").unlink()
    code, report, _ = run_cli(args, capsys)
    assert _statuses(report)["a.pt"] == ("converted", "bitwise")
    assert _statuses(report)["sub/b.pt"] == ("converted", "bitwise")
    _same_tensors(zoo / "a.pt", out / "a.safetensors")

    # other options, other outputs: everything is converted again
    code, report, _ = run_cli([*args, "--metadata", "origin=zoo"], capsys)
    assert {s for s, _ in _statuses(report).values()} == {"converted", "failed"}
    with safe_open(out / "a.safetensors", "pt") as f:
        assert f.metadata()["origin"] == "zoo"


def test_an_output_the_batch_did_not_write_is_kept_without_force(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zoo, out = _zoo(samples, tmp_path), tmp_path / "out"
    out.mkdir()
    (out / "a.safetensors").write_bytes(b"someone else's file")
    code, report, _ = run_cli([str(zoo), "--to", "safetensors", "-o", str(out)], capsys)
    assert code == 8
    assert _statuses(report)["a.pt"] == ("failed", "none")
    assert (out / "a.safetensors").read_bytes() == b"someone else's file"


def test_a_rerun_never_replaces_a_file_someone_else_put_at_an_output(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zoo, out = _zoo(samples, tmp_path), tmp_path / "out"
    args = [str(zoo), "--to", "safetensors", "-o", str(out), "--keep-going"]
    assert run_cli(args, capsys)[0] == 3
    (out / "a.safetensors").write_bytes(b"my own notes")  # the user's file, where ours was
    torch.save({k: v * 2 for k, v in torch.load(zoo / "a.pt").items()}, zoo / "a.pt")
    code, report, _ = run_cli(args, capsys)
    assert code == 8  # a.pt's: the first failure in the order of the files
    assert _statuses(report)["a.pt"] == ("failed", "none")
    assert next(i for i in report["items"] if i["src"] == "a.pt")["error"]["exit_code"] == 8
    assert (out / "a.safetensors").read_bytes() == b"my own notes"


def test_an_output_folder_inside_the_source_folder_is_not_searched(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zoo = _zoo(samples, tmp_path)
    args = [str(zoo), "--to", "safetensors", "-o", str(zoo / "out"), "--keep-going"]
    assert run_cli(args, capsys)[0] == 3
    code, report, _ = run_cli(args, capsys)
    assert {i["src"] for i in report["items"]} == {"a.pt", "broken.pt", "sub/b.pt"}
    assert report["counts"]["skipped"] == 2
    code, report, _ = run_cli([str(zoo), "--to", "safetensors", "-o", str(zoo)], capsys)
    assert code == 2 and "source folder" in report["error"]["message"]


def test_a_changed_shard_is_converted_again_and_symlinked_folders_are_followed(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    shutil.copytree(samples["block_sharded_safetensors"].parent, zoo / "block")
    (zoo / "bert").symlink_to(samples["hf_bert"], target_is_directory=True)
    args = [str(zoo), "--to", "safetensors", "-o", str(tmp_path / "out")]
    code, report, _ = run_cli(args, capsys)
    assert code == 0, report
    index = samples["block_sharded_safetensors"].name
    assert _statuses(report) == {
        "bert": ("converted", "bitwise"),
        f"block/{index}": ("converted", "bitwise"),
    }
    shard = sorted((zoo / "block").glob("*.safetensors"))[-1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # the same size, another weight
    shard.write_bytes(bytes(data))
    code, report, _ = run_cli(args, capsys)
    assert _statuses(report)[f"block/{index}"] == ("converted", "bitwise")
    assert _statuses(report)["bert"] == ("skipped", "bitwise")


def _dies_on_a(src: str, to: str, output: str, opts: Any) -> Any:
    """ptconvert.convert, except that the process dies on a.pt (out of memory, a segfault)."""
    import ptconvert

    if src.endswith("a.pt"):
        os._exit(9)
    return ptconvert.convert(src, to, output, opts)


def test_a_dead_worker_fails_its_model_only(samples: dict[str, Path], tmp_path: Path) -> None:
    from ptconvert.convert.batch import convert_many
    from ptconvert.options import Options

    report = convert_many(
        _zoo(samples, tmp_path),
        "safetensors",
        tmp_path / "out",
        Options(),
        jobs=2,
        keep_going=True,
        convert=_dies_on_a,
    )
    assert [(i.src, i.status) for i in report.items] == [
        ("a.pt", "failed"),
        ("broken.pt", "failed"),
        ("sub/b.pt", "converted"),
    ]
    assert report.items[0].error is not None
    assert "worker process died" in report.items[0].error["message"]
    assert report.exit_code == 1


def test_without_keep_going_nothing_starts_after_a_failure(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zoo, out = _zoo(samples, tmp_path, broken="0-broken.pt"), tmp_path / "out"
    code, report, _ = run_cli([str(zoo), "--to", "safetensors", "-o", str(out)], capsys)
    assert code == 3
    assert _statuses(report) == {
        "0-broken.pt": ("failed", "none"),
        "a.pt": ("not-run", "none"),
        "sub/b.pt": ("not-run", "none"),
    }
    assert not (out / "a.safetensors").exists()


def test_a_folder_without_models_is_an_error_that_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("no weights here\n")
    code, report, _ = run_cli([str(tmp_path), "--to", "pt2", "-o", str(tmp_path / "o")], capsys)
    assert code == 3
    assert "no model under this folder" in report["error"]["message"]


def test_a_folder_needs_an_output_folder(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report, _ = run_cli([str(_zoo(samples, tmp_path)), "--to", "safetensors"], capsys)
    assert code == 2
    assert "-o OUT_DIR" in report["error"]["message"]


def test_models_under_a_folder_are_found_as_a_user_lays_them_out(
    samples: dict[str, Path],
) -> None:
    root = samples["mlp_zip"].parent
    found = {str(p.relative_to(root)) for p in models_under(root)}
    assert {"hf-bert", "hf-gpt2-bin", "mlp.pt", "mlp.pt2", "mlp.onnx", "cnn.safetensors"} <= found
    # a Hugging Face directory is one model; a sharded index stands for its shards
    assert not any(f.startswith("hf-bert/") for f in found)
    sharded = samples["block_sharded_safetensors"].relative_to(root)
    assert str(sharded) in found
    assert not any(f.startswith(str(sharded.parent)) and f != str(sharded) for f in found)


def test_convert_many_is_the_api_of_the_batch(samples: dict[str, Path], tmp_path: Path) -> None:
    import ptconvert

    report = ptconvert.convert_many(
        _zoo(samples, tmp_path), "safetensors", tmp_path / "out", keep_going=True
    )
    assert report.exit_code == 3
    assert [i.status for i in report.items] == ["converted", "failed", "converted"]
    assert json.loads(report.to_json())["counts"]["converted"] == 2


@pytest.mark.slow  # a local Ray cluster (~10 s to start) and pt2 exports in its workers
def test_ray_converts_the_folder_with_the_same_summary_and_exit_code(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ray = pytest.importorskip("ray")  # the `ray` extra: `make setup` installs it
    zoo = _zoo(samples, tmp_path)
    local_code, local, _ = run_cli(
        [str(zoo), "--to", "safetensors", "-o", str(tmp_path / "local"), "--keep-going"], capsys
    )
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        address = ray.get_runtime_context().gcs_address
        env = {**os.environ, "RAY_ADDRESS": address}
        common = ["-j", "2", "--keep-going", "--json", "--executor", "ray"]
        on_cluster = [*common, "--ray-address", address]
        run = subprocess.run(
            [*PTCONVERT, str(zoo), "--to", "safetensors", "-o", str(tmp_path / "ray"), *common],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
        )
        programs = subprocess.run(
            [
                *PTCONVERT,
                str(zoo),
                "--to",
                "pt2",
                "-o",
                str(tmp_path / "pt2"),
                *MLP_ARGS,
                *on_cluster,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "RAY_ADDRESS": ""},
            cwd=REPO,
        )
    finally:
        ray.shutdown()
    assert run.returncode == local_code == 3, run.stderr
    remote = json.loads(run.stdout)
    assert remote["executor"] == "ray"
    assert _statuses(remote) == _statuses(local)
    assert remote["counts"] == local["counts"]
    _same_tensors(zoo / "a.pt", tmp_path / "ray" / "a.safetensors")

    assert programs.returncode == 3, programs.stderr
    report = json.loads(programs.stdout)
    assert _statuses(report)["a.pt"] == ("converted", "parity")
    assert _statuses(report)["sub/b.pt"] == ("converted", "parity")
    program = torch.export.load(tmp_path / "pt2" / "sub" / "b.pt2").module()
    model = __import__("fixtures.models", fromlist=["MLP"]).MLP()
    model.load_state_dict(torch.load(zoo / "sub" / "b.pt", weights_only=True))
    x = torch.randn(5, 8)
    torch.testing.assert_close(program(x), model(x))
