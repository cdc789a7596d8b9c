"""The weights check compares each tensor while the writer copies the next one
(verify/weights.CompareAhead, fed by byte_copy.reporting_copies), and what it compared then counts
only where the finished output's own reader places the tensor."""

from __future__ import annotations

import os
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import ptconvert
from ptconvert.errors import VerificationError
from ptconvert.formats import byte_copy
from ptconvert.verify import same_bytes
from ptconvert.verify import weights as check
from ptconvert.weights.read import read_weights

AHEAD = "ptconvert-compare"


def source(tmp_path: Path, fmt: str) -> tuple[Path, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(50, 8, generator=gen)
    sd = {
        "embed.weight": emb,
        "lm_head.weight": emb,  # tied: stored once, checked under both names
        "block.w": torch.randn(64, 32, generator=gen).bfloat16(),
        "block.b": torch.randn(32, generator=gen).half(),
    }
    if fmt == "pt":
        path = tmp_path / "m.pt"
        torch.save(sd, path)
    else:
        path = tmp_path / "m.safetensors"
        save_file({k: v for k, v in sd.items() if k != "lm_head.weight"}, path)
    return path, sd


def record_comparisons(monkeypatch) -> list[tuple[str, int | None]]:
    """Each in-place comparison: the thread that made it and what it found."""
    calls: list[tuple[str, int | None]] = []
    real = same_bytes.first_difference

    def recorded(*args: Any) -> int | None:
        at = real(*args)
        calls.append((threading.current_thread().name, at))
        return at

    monkeypatch.setattr(check, "first_difference", recorded)
    return calls


@pytest.mark.parametrize(("src_fmt", "to"), [("pt", "safetensors"), ("safetensors", "pt")])
def test_every_tensor_is_compared_while_the_output_is_written(
    src_fmt: str, to: str, tmp_path: Path, monkeypatch
) -> None:
    src, sd = source(tmp_path, src_fmt)
    calls = record_comparisons(monkeypatch)
    out = tmp_path / f"o.{to}"
    report = ptconvert.convert(src, to, out)
    check_report = report.weights.verification
    assert check_report.status == "pass"
    stored = 3
    assert [name for name, _ in calls] == [AHEAD] * stored  # none again after the write
    assert all(at is None for _, at in calls)
    assert check_report.tensors >= stored
    assert check_report.bytes_compared >= 50 * 8 * 4 + 64 * 32 * 2 + 32 * 2
    if to == "pt":  # torch's own loader reads what was checked
        back = torch.load(out)
        assert set(back) <= set(sd) and all(torch.equal(v, sd[k]) for k, v in back.items())


def test_a_byte_the_copy_got_wrong_is_found_while_written(tmp_path: Path, monkeypatch) -> None:
    """The kernel's copy of one tensor leaves a wrong byte: the comparison made during the
    write finds it, the conversion fails and leaves no output."""
    src, _ = source(tmp_path, "pt")
    calls = record_comparisons(monkeypatch)
    real = byte_copy._copy

    def flips_a_byte(src_fd: int, offset: int, dst_fd: int, nbytes: int, path: Path) -> None:
        at = os.lseek(dst_fd, 0, os.SEEK_CUR)
        real(src_fd, offset, dst_fd, nbytes, path)
        if nbytes == 64 * 32 * 2:  # block.w
            byte = os.pread(dst_fd, 1, at + 100)
            os.pwrite(dst_fd, bytes([byte[0] ^ 0x10]), at + 100)

    monkeypatch.setattr(byte_copy, "_copy", flips_a_byte)
    out = tmp_path / "o.safetensors"
    with pytest.raises(VerificationError, match=r"block\.w: bytes differ within \[0,"):
        ptconvert.convert(src, "safetensors", out)
    assert calls == [(AHEAD, None), (AHEAD, 0), (AHEAD, None)]  # found during the write
    assert not out.exists()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts fds in /proc")
def test_one_fd_per_output_file_and_none_left(tmp_path: Path, monkeypatch) -> None:
    """However many tensors are written while the reference is still being read, the check
    holds one fd of each output file, and closes it when done; a failed write drops what is
    queued and leaves no fd either."""
    src, _ = source(tmp_path, "pt")
    ws = read_weights(src)
    out = tmp_path / "o.bin"
    out.write_bytes(b"x" * 4096)
    gate = threading.Event()
    real = check.reference

    def slow_reference(*args: Any) -> Any:
        gate.wait(5)
        return real(*args)

    monkeypatch.setattr(check, "reference", slow_reference)
    for cancel in (False, True):
        before = open_fds()
        ahead = check.CompareAhead(ws, None, False)
        with open(out, "rb") as fh:
            for i in range(500):
                ahead.written(f"t{i}", fh.fileno(), 0, 16)
            assert open_fds() == before + 2  # the file here, and one dup of it
        gate.set()
        assert ahead.finish(cancel=cancel) == {}  # no such tensors in the source
        assert open_fds() == before
        gate.clear()


def test_a_comparison_of_another_place_is_not_taken(tmp_path: Path) -> None:
    """What was compared during the write counts for the very ranges compared: a tensor that
    the finished output holds elsewhere (here: bytes changed after a claimed comparison of
    another offset) is compared again, and the difference found."""
    src, _ = source(tmp_path, "pt")
    out = tmp_path / "o.safetensors"
    ptconvert.convert(src, "safetensors", out, verify=False)
    ws, back = read_weights(src), read_weights(out)
    w = next(e for e in back.entries if e.name == "block.w")
    assert w.source is not None
    raw = bytearray(out.read_bytes())
    raw[w.source.offset + 7] ^= 0x01
    out.write_bytes(bytes(raw))
    st = os.stat(out)
    with ExitStack() as stack:  # the source's reference reading: where it reads block.w
        span = check.reference(ws, None, False, stack).tensors["block.w"].span
    claimed = {(span, (st.st_dev, st.st_ino), w.source.offset + 64, w.nbytes): None}
    with pytest.raises(VerificationError, match=r"block\.w: bytes differ"):
        check.verify_weights(ws, out, compared=claimed)
    # the same claim for the exact range the output holds is taken as made
    exact = {(span, (st.st_dev, st.st_ino), w.source.offset, w.nbytes): None}
    assert check.verify_weights(ws, out, compared=exact).status == "pass"
