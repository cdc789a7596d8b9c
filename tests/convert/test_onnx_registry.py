"""torch.onnx's registry of ONNX translations is built once per process and opset, not once per
export (convert/onnx_export._one_registry): a seq2seq model with past is three exports."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

import ptconvert
from ptconvert.formats.onnx.edges import export as onnx_export


def test_exports_share_the_registry_and_leave_torch_as_it_was(samples, tmp_path: Path, monkeypatch):
    from torch.onnx._internal.exporter import _registration

    built: list[int] = []
    real = _registration.ONNXRegistry.__dict__["from_torchlib"]

    def counting(cls, *args, **kwargs):
        built.append(1)
        return real.__func__(cls, *args, **kwargs)

    monkeypatch.setattr(_registration.ONNXRegistry, "from_torchlib", classmethod(counting))
    monkeypatch.setattr(onnx_export, "_REGISTRIES", {})
    for name in ("a", "b"):
        out = tmp_path / f"{name}.onnx"
        ptconvert.convert(samples["mlp_pt2"], "onnx", out, verify=name == "b")
        onnx.checker.check_model(str(out), full_check=True)
    assert len(built) == 1
    # outside an export, torch's own classmethod again (a user's torch.onnx.export builds its own)
    assert _registration.ONNXRegistry.__dict__["from_torchlib"].__func__ is counting
    ptconvert.convert(samples["mlp_pt2"], "onnx", tmp_path / "c.onnx", opset=18, verify=False)
    assert len(built) == 2  # another opset: its own registry


@pytest.mark.parametrize("missing", ["module", "classmethod"])
def test_a_torch_without_the_hook_builds_its_own(missing, samples, tmp_path: Path, monkeypatch):
    from torch.onnx._internal.exporter import _registration

    if missing == "module":
        import sys

        monkeypatch.setitem(sys.modules, "torch.onnx._internal.exporter._registration", None)
        with onnx_export._one_registry():
            pass
        monkeypatch.undo()
    else:
        monkeypatch.setattr(_registration.ONNXRegistry, "from_torchlib", staticmethod(lambda: 0))
        with onnx_export._one_registry():
            assert _registration.ONNXRegistry.from_torchlib() == 0
