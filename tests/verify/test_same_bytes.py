"""Byte ranges of two files compared in place (verify/same_bytes.py), and the weights check's
use of it: every tensor both sides store as it is is compared there, not read into Python."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import ptconvert
from ptconvert.verify import same_bytes
from ptconvert.verify import weights as check


def files(tmp_path: Path, size: int, at_a: int, at_b: int) -> tuple[Path, Path, bytes]:
    data = bytes((i * 7 + 3) % 251 for i in range(size))
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"x" * at_a + data)
    b.write_bytes(b"y" * at_b + data + b"tail")
    return a, b, data


def test_equal_ranges_at_unaligned_offsets(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(same_bytes, "WINDOW", 4096)  # several windows, each unaligned
    a, b, data = files(tmp_path, 3 * 4096 + 5, at_a=13, at_b=4099)
    assert same_bytes.first_difference((a, 13), (b, 4099), len(data)) is None
    assert same_bytes.first_difference((a, 13), (b, 4099), 0) is None


def test_a_difference_is_found_in_its_window(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(same_bytes, "WINDOW", 4096)
    a, b, data = files(tmp_path, 3 * 4096, at_a=0, at_b=100)
    raw = bytearray(b.read_bytes())
    raw[100 + 2 * 4096 + 17] ^= 1  # the last byte the third window compares but one
    b.write_bytes(bytes(raw))
    assert same_bytes.first_difference((a, 0), (b, 100), len(data)) == 2 * 4096
    assert same_bytes.first_difference((a, 0), (b, 100), 2 * 4096) is None


def test_pairs_are_compared_in_pieces_by_threads(tmp_path: Path, monkeypatch) -> None:
    """first_differences cuts each pair in pieces that worker threads compare: the first
    difference of a pair is the earliest any of its pieces finds (a short file: where it
    ends), each pair apart, and a pair that cannot be mapped is said as such."""
    import threading

    monkeypatch.setattr(same_bytes, "WINDOW", 4096)
    monkeypatch.setattr(same_bytes, "PIECE", 2 * 4096)
    a, b, data = files(tmp_path, 7 * 4096 + 11, at_a=3, at_b=4100)
    raw = bytearray(b.read_bytes())
    raw[4100 + 5 * 4096 + 9] ^= 1  # in the third piece (of four), its second window
    raw[4100 + 6 * 4096 + 1] ^= 1  # and later, in the fourth
    b.write_bytes(bytes(raw))
    c = tmp_path / "c.bin"
    c.write_bytes(data[: 3 * 4096 + 100])  # short: ends within the second piece
    threads: set[str] = set()
    real = same_bytes.first_difference

    def recorded(*args: object) -> int | None:
        threads.add(threading.current_thread().name)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(same_bytes, "first_difference", recorded)
    pairs = [
        ((a, 3), (b, 4100), len(data)),
        ((a, 3), (b, 4100), 5 * 4096),  # before both changes
        ((a, 3), (c, 0), len(data)),
        ((a, 3), (a, 3), len(data)),
    ]
    assert same_bytes.first_differences(pairs) == [5 * 4096, None, 3 * 4096 + 100, None]
    # many small pairs go to few tasks, each still said apart
    small = [((a, 3 + k), (b, 4100 + k), 50) for k in range(0, 5 * 4096, 250)]
    changed = ((a, 3 + 5 * 4096), (b, 4100 + 5 * 4096), 50)
    found = same_bytes.first_differences([*small, changed, *small])
    assert found == [None] * len(small) + [0] + [None] * len(small)
    assert threads and all(name.startswith("ptconvert-compare") for name in threads)

    def unmappable(*args: object) -> int | None:
        raise same_bytes.Unmappable("no map here")

    monkeypatch.setattr(same_bytes, "first_difference", unmappable)
    [found] = same_bytes.first_differences(pairs[:1])
    assert isinstance(found, same_bytes.Unmappable)


def test_a_short_file_differs_where_it_ends(tmp_path: Path) -> None:
    a, b, data = files(tmp_path, 10_000, at_a=0, at_b=0)
    a.write_bytes(data[:6000])  # no map past its end: that would fault on access
    assert same_bytes.first_difference((a, 0), (b, 0), len(data)) == 6000
    assert same_bytes.first_difference((a, 9000), (b, 0), 100) == 0


@pytest.mark.parametrize("target", ["safetensors", "pt"])
def test_the_weights_check_compares_stored_tensors_in_place(
    target: str, tmp_path: Path, monkeypatch
) -> None:
    """pt → safetensors and safetensors → pt: no tensor goes through the chunked reading (it
    reads both files into buffers), and a changed byte is still found in place."""
    gen = torch.Generator().manual_seed(0)
    sd = {"w": torch.randn(300, 7, generator=gen), "h": torch.randn(9, generator=gen).half()}
    src = tmp_path / ("m.pt" if target == "safetensors" else "m.safetensors")
    torch.save(sd, src) if target == "safetensors" else save_file(sd, src)

    def chunked(*args: object) -> None:
        raise AssertionError("compared in chunks")

    monkeypatch.setattr(check, "_output_reader", chunked)
    out = tmp_path / f"o.{'safetensors' if target == 'safetensors' else 'pt'}"
    report = ptconvert.convert(src, target, out)
    assert report.weights.verification.status == "pass"
    assert report.weights.verification.bytes_compared == 300 * 7 * 4 + 9 * 2

    source = ptconvert.weights.read.read_weights(src)
    raw = bytearray(out.read_bytes())
    at = bytes(raw).index(sd["w"][100].numpy().tobytes())
    raw[at + 1] ^= 0x40
    out.write_bytes(bytes(raw))
    with pytest.raises(ptconvert.errors.VerificationError, match="w: bytes differ within"):
        check.verify_weights(source, out)
