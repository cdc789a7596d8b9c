"""The pt2 save step writes each weight from where it lies (formats/pt2/edges/save.py): the same
archive as torch's own save, record for record, without a bytes copy of any tensor."""

from __future__ import annotations

import io
import tracemalloc
import zipfile
from pathlib import Path

import torch
from torch import nn

from ptconvert.formats.pt2 import saves_in_place as available
from ptconvert.formats.pt2.edges.save import records_in_place


class Tied(nn.Module):
    """A large embedding tied to the output layer, a buffer viewing part of another tensor's
    storage, and an empty buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(4096, 256)  # 4 MiB
        self.out = nn.Linear(256, 4096, bias=False)
        self.out.weight = self.emb.weight
        whole = torch.arange(64.0)
        self.register_buffer("tail", whole[32:])
        self.register_buffer("empty", torch.zeros(0))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(ids)) + self.tail.sum() + self.empty.sum()


def _records(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {n: z.read(n) for n in z.namelist() if not n.endswith("serialization_id")}


def _saved(ep: torch.export.ExportedProgram) -> tuple[bytes, int]:
    """The archive and the largest allocation Python made while writing it."""
    buffer = io.BytesIO()
    tracemalloc.start()
    try:
        torch.export.save(ep, buffer)
        peak = tracemalloc.get_traced_memory()[1] - len(buffer.getvalue())
    finally:
        tracemalloc.stop()
    return buffer.getvalue(), peak


def test_the_archive_is_torchs_own_and_no_tensor_is_copied(tmp_path: Path) -> None:
    assert available()
    torch.manual_seed(0)
    ids = torch.randint(0, 4096, (2, 8))
    ep = torch.export.export(Tied().eval(), (ids,))
    plain, plain_peak = _saved(ep)
    with records_in_place():
        direct, direct_peak = _saved(ep)
    assert _records(direct) == _records(plain)
    assert plain_peak > 4 * 2**20 > direct_peak  # torch copied the 4 MiB embedding once
    path = tmp_path / "t.pt2"
    path.write_bytes(direct)
    loaded = torch.export.load(path).module()
    assert torch.equal(loaded(ids), ep.module()(ids))


def test_torchs_writer_is_put_back(tmp_path: Path) -> None:
    from torch.export.pt2_archive import _package

    before = (_package._get_raw_tensor_bytes, _package.PT2ArchiveWriter.write_bytes)
    try:
        with records_in_place():
            raise KeyError("stop")
    except KeyError:
        pass
    assert (_package._get_raw_tensor_bytes, _package.PT2ArchiveWriter.write_bytes) == before


def test_the_save_warns_of_nothing(tmp_path: Path, capfd) -> None:
    """The records are handed over as torch.save hands them: a storage's data pointer is a
    deprecated form that printed a warning on stderr for every record of every conversion."""
    import warnings

    ep = torch.export.export(Tied().eval(), (torch.randint(0, 4096, (2, 8)),))
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught, records_in_place():
        warnings.simplefilter("always")
        torch.export.save(ep, tmp_path / "t.pt2")
    err = capfd.readouterr().err
    assert "deprecated" not in err and not [w for w in caught if "write_record" in str(w.message)]
