"""The torch a feature needs (deps.require_torch / torch_dtype): a clear error on an older torch.

pyproject.toml declares torch>=2.13 with no cap. What only a newer torch has (so far: the
bcomplex32 dtype of torch 2.14, which files a newer torch writes can hold) goes through deps.py,
and a too-old torch is a MissingRequirementError naming the feature, the installed torch and the
release needed. These tests run on either end of the range (`make test`, `make test-newest`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ptconvert import deps
from ptconvert.deps import _release, require_torch, torch_dtype
from ptconvert.errors import MissingRequirementError
from ptconvert.formats.torch_zip import write_torch_zip
from ptconvert.formats.weightset import ByteRange, WeightEntry, WeightSet
from tests.conftest import run_cli


@pytest.mark.parametrize(
    ("version", "release"),
    [
        ("2.13", (2, 13)),
        ("2.13.0+cpu", (2, 13)),
        ("2.14.1+cu130", (2, 14, 1)),
        ("2.14.0a0+git1234", (2, 14)),  # a nightly of 2.14 has what 2.14 has
        ("2.14.0.dev20260101", (2, 14)),
        ("3", (3,)),
    ],
)
def test_release_numbers(version: str, release: tuple[int, ...]) -> None:
    assert _release(version) == release


def test_require_torch_passes_at_the_floor_and_names_everything_above_it() -> None:
    require_torch("2.13", "anything")  # the floor pyproject.toml declares
    require_torch(str(torch.__version__), "anything")
    with pytest.raises(MissingRequirementError) as caught:
        require_torch("99.1", "the frobnicator", instead="pass --no-frob")
    err = caught.value
    assert err.exit_code == 5
    installed = torch.__version__
    assert err.message == f"the frobnicator needs torch>=99.1; torch {installed} is installed"
    assert err.hint == "pip install 'torch>=99.1', or pass --no-frob"


def test_torch_dtype_resolves_names_and_refuses_what_torch_lacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert torch_dtype("float32", "x") is torch.float32
    with pytest.raises(MissingRequirementError, match=r"x needs the dtype float99, which torch"):
        torch_dtype("float99", "x")
    monkeypatch.setitem(deps.TORCH_DTYPES_SINCE, "float32", "99.0")
    with pytest.raises(MissingRequirementError, match=r"x \(float32 is new in torch 99.0\) needs"):
        torch_dtype("float32", "x")


def test_a_too_old_torch_stops_the_check_with_the_release_it_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Simulated on any torch: float32 'needs torch 99.0'. The bytes are copied without torch,
    so --no-verify still converts; the check of a program source, whose own loader hands them
    to torch, says what it needs. Pickle and safetensors sources are checked without torch (the
    records reader; safe_open and the header's offsets): their check runs on any torch."""
    from safetensors.torch import save_file

    program = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(3, 2), (torch.ones(1, 3),)), program)
    save_file({"w": torch.ones(3)}, tmp_path / "w.safetensors")
    monkeypatch.setitem(deps.TORCH_DTYPES_SINCE, "float32", "99.0")
    out = tmp_path / "o.safetensors"
    code, report, _ = run_cli([str(program), "--to", "safetensors", "-o", str(out)], capsys)
    assert code == 5 and report["error"]["type"] == "MissingRequirementError"
    message = report["error"]["message"]
    assert "checking the float32 tensors (float32 is new in torch 99.0) needs torch" in message
    assert "--no-verify" in report["error"]["hint"]
    assert not out.exists()  # nothing left behind
    code, _, _ = run_cli(
        [str(program), "--to", "safetensors", "-o", str(out), "--no-verify"], capsys
    )
    assert code == 0 and out.exists()
    src, back = tmp_path / "w.safetensors", tmp_path / "o.pt"
    code, report, _ = run_cli([str(src), "--to", "pt", "-o", str(back)], capsys)
    assert code == 0 and report["weights"]["verification"]["status"] == "pass", report


def _bcomplex32_checkpoint(tmp_path: Path) -> tuple[Path, bytes]:
    """A checkpoint as torch 2.14's torch.save writes one (written without torch, so any torch
    can have it): three bcomplex32 values (two bfloat16 each) and a float32 tensor."""
    raw = bytes(range(12)) + torch.ones(2).numpy().tobytes()
    (tmp_path / "raw").write_bytes(raw)
    ws = WeightSet(
        [
            WeightEntry("b", "bcomplex32", (3,), 12, ByteRange(tmp_path / "raw", 0)),
            WeightEntry("f", "float32", (2,), 8, ByteRange(tmp_path / "raw", 12)),
        ],
        "fast",
    )
    write_torch_zip(ws, tmp_path / "b.pt")
    return tmp_path / "b.pt", raw[:12]


def test_a_bcomplex32_checkpoint_converts_or_names_the_torch_it_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, data = _bcomplex32_checkpoint(tmp_path)
    code, report, _ = run_cli(["scan", str(src)], capsys)
    assert code == 0 and report["verdict"] == "clean"  # the allowlist knows the dtype
    code, report, _ = run_cli([str(src), "--to", "pt", "-o", str(tmp_path / "o.pt")], capsys)
    if hasattr(torch, "bcomplex32"):  # torch 2.14 on: read back by torch.load, bitwise
        assert code == 0 and report["weights"]["verification"]["status"] == "pass"
        back = torch.load(tmp_path / "o.pt", weights_only=True)
        assert back["b"].dtype == torch.bcomplex32
        assert back["b"].view(torch.uint8).numpy().tobytes() == data
    else:  # torch 2.13: the records reader checks the bytes without torch (it knows the
        # dtype's size); torch itself cannot read the output back, ptconvert's reader does
        assert code == 0 and report["weights"]["verification"]["status"] == "pass", report
        assert "pickle records" in report["weights"]["verification"]["reader"]
        from ptconvert.weights.read import read_weights

        back = {e.name: e for e in read_weights(tmp_path / "o.pt").entries}
        assert back["b"].dtype == "bcomplex32" and tuple(back["b"].shape) == (3,)
