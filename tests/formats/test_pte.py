"""ExecuTorch programs (.pte): detected by their flatbuffer identifier, described by ptconvert's
own reading of the flatbuffer (checked against ExecuTorch's deserializer), scanned as a file that
holds no pickle. The programs are lowered here with ExecuTorch's own API, not by ptconvert."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

from fixtures.models import MLP, seeded
from ptconvert import describe, detect
from ptconvert.errors import CorruptFileError, UnknownFormatError
from ptconvert.formats.pte.flatbuffer import read_program
from ptconvert.scan.scanner import scan_file

pytest.importorskip("executorch")


@pytest.fixture(scope="module")
def ptes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An MLP with a batch of 1–8 delegated to XNNPACK, and one on the portable kernels."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from torch.export import Dim

    out = tmp_path_factory.mktemp("pte")
    model, x = seeded(MLP()).eval(), torch.randn(2, 8)
    dynamic = torch.export.export(model, (x,), dynamic_shapes=({0: Dim("b", min=1, max=8)},))
    static = torch.export.export(model, (x,))
    paths = {}
    for name, ep, parts in (
        ("xnnpack", dynamic, [XnnpackPartitioner()]),
        ("portable", static, []),
    ):
        program = to_edge_transform_and_lower(ep, partitioner=parts).to_executorch()
        paths[name] = out / f"mlp-{name}.pte"
        paths[name].write_bytes(program.buffer)
    return paths


def test_detected_by_content_whatever_its_name(ptes: dict[str, Path], tmp_path: Path) -> None:
    renamed = tmp_path / "model.bin"
    shutil.copy(ptes["xnnpack"], renamed)
    d = detect(renamed)
    assert (d.format, d.layout) == ("pte", "flatbuffer")
    fake = tmp_path / "fake.pte"  # the identifier, but a root table outside the file
    fake.write_bytes(b"\xff\xff\x00\x00ET12" + b"\x01" * 24)
    with pytest.raises(UnknownFormatError):
        detect(fake)


def test_info_reads_the_flatbuffer_without_executorch(
    ptes: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary

    for name, path in ptes.items():
        # ExecuTorch's own reading, before it is hidden
        theirs = deserialize_pte_binary(path.read_bytes()).program.execution_plan[0]
        monkeypatch.setitem(sys.modules, "executorch", None)  # info imports nothing of it
        info = describe(path)
        monkeypatch.delitem(sys.modules, "executorch")
        forward = info.metadata["methods"]["forward"]
        shape = [8, 8] if name == "xnnpack" else [2, 8]
        assert [(i.dtype, i.shape) for i in info.inputs] == [("float32", shape)]
        ours = read_program(path).methods[0]
        table = {f"{o.name}.{o.overload}" if o.overload else o.name for o in theirs.operators}
        assert set(ours.portable_ops) <= table
        assert set(ours.delegates) == {d.id for d in theirs.delegates}
        assert ours.planned_bytes == sum(theirs.non_const_buffer_sizes)
        assert [t.sizes for t in ours.inputs] == [theirs.values[i].val.sizes for i in theirs.inputs]
        if name == "xnnpack":  # every op in XNNPACK's one delegate call; weights in named data
            assert info.metadata["delegates"] == {"XnnpackBackend": 1}
            assert forward["portable_ops"] == {}
            assert forward["inputs"] == ["float32[8, 8] (upper bounds)"]
            assert info.metadata["data_bytes"]["named data"] >= 4 * (8 * 16 + 16 * 4)
            assert any("upper bounds" in n for n in info.notes)
        else:  # no delegate: the linear layers are portable kernel calls, weights constants
            assert info.metadata["delegates"] == {}
            assert any(op.startswith("aten::") for op in forward["portable_ops"])
            assert info.parameters == sum(p.numel() for p in MLP().parameters())
            assert info.metadata["data_bytes"]["constants"] >= 4 * info.parameters


def test_a_truncated_program_is_corrupt(ptes: dict[str, Path], tmp_path: Path) -> None:
    cut = tmp_path / "cut.pte"
    cut.write_bytes(ptes["portable"].read_bytes()[:200])
    with pytest.raises(CorruptFileError):
        describe(cut)


def test_scan_says_it_holds_no_pickle_and_names_its_delegates(ptes: dict[str, Path]) -> None:
    for name, path in ptes.items():
        scan = scan_file(path)
        assert (scan.verdict, scan.pickles, scan.findings) == ("clean", 0, [])
        assert "holds no pickle" in scan.notes[0]
        if name == "xnnpack":
            assert "XnnpackBackend" in scan.notes[1] and "no code" in scan.notes[1]
        else:
            assert "portable kernels" in scan.notes[1]
