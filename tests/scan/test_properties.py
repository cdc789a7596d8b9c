"""Property-based tests of the readers that see untrusted bytes first.

The pickle machine, the safetensors header reader, the zip reader, ``detect``, ``describe`` and
the scanner get mutated real files and random bytes. Each must succeed or raise a
``PtconvertError`` (the scanner: return a verdict) — never another exception, never hang, and
never allocate memory in proportion to a size the file merely claims. CI runs a fixed budget;
``pytest -m fuzz`` runs the long version.
"""

from __future__ import annotations

import io
import pickle
import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ptconvert.archive import open_zip
from ptconvert.errors import PtconvertError
from ptconvert.formats import describe, detect
from ptconvert.formats.safetensors import read_header
from ptconvert.pickles.machine import run_pickle
from ptconvert.pickles.torch_streams import run_torch_pickles
from ptconvert.scan.scanner import scan_file

CI_EXAMPLES = 40
LONG_EXAMPLES = 3000
MEMORY_LIMIT = 64 << 20  # Python allocations per example; real files here are a few KiB


def _seeds() -> dict[str, bytes]:
    """Small real files of every kind the readers meet, written by their own tools."""
    from safetensors.torch import save

    sd = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(3)}
    zipped, legacy = io.BytesIO(), io.BytesIO()
    torch.save(sd, zipped)
    torch.save(sd, legacy, _use_new_zipfile_serialization=False)
    return {
        "zip": zipped.getvalue(),
        "legacy": legacy.getvalue(),
        "pickle0": pickle.dumps({"a": [1, 2.5, "x"], "b": (None, True)}, protocol=0),
        "pickle5": pickle.dumps({"a": [1, 2.5, "x"], "b": (None, True)}, protocol=5),
        "safetensors": save(sd, metadata={"format": "pt"}),
    }


SEEDS = _seeds()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A real file with a few bytes flipped, a span cut out or repeated, or random bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=2048))
    data = bytearray(SEEDS[draw(st.sampled_from(sorted(SEEDS)))])
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "dup", "int"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif op == "cut":
            del data[pos : pos + draw(st.integers(1, 64))]
        elif op == "dup":
            data[pos:pos] = data[pos : pos + draw(st.integers(1, 64))]
        elif op == "int" and pos + 8 <= len(data):
            # sizes and offsets are where readers trust a file: claim something huge
            big = draw(st.sampled_from([0xFFFFFFFF, 1 << 40, (1 << 63) - 1, 2**31]))
            data[pos : pos + 8] = struct.pack("<Q", big)
    return bytes(data)


def _bounded(fn: Callable[[], object]) -> None:
    """Run ``fn``: a PtconvertError is an answer; its Python allocations must stay bounded."""
    tracemalloc.start()
    try:
        fn()
    except PtconvertError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < MEMORY_LIMIT, f"{peak >> 20} MiB allocated"


def _write(tmp: Path, data: bytes) -> Path:
    path = tmp / "sample.bin"
    path.write_bytes(data)
    return path


def check_machine(data: bytes) -> None:
    run = run_pickle(data)  # errors are part of the result, never raised
    assert run.error is None or isinstance(run.error, str)
    run_torch_pickles(data)


def check_readers(tmp: Path, data: bytes) -> None:
    path = _write(tmp, data)
    _bounded(lambda: read_header(path))
    _bounded(lambda: [z.read(m) for z in [open_zip(path)] for m in z.members])
    _bounded(lambda: detect(path))
    _bounded(lambda: describe(path))
    result = scan_file(path)
    assert result.verdict in ("clean", "needs-code", "dangerous", "error")


_SETTINGS = {
    "deadline": 5000,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}


@settings(max_examples=CI_EXAMPLES * 5, **_SETTINGS)  # type: ignore[arg-type]
@given(mutated())
def test_machine_never_raises(data: bytes) -> None:
    check_machine(data)


@settings(max_examples=CI_EXAMPLES, **_SETTINGS)  # type: ignore[arg-type]
@given(mutated())
def test_readers_answer_or_raise_their_own_errors(tmp_path: Path, data: bytes) -> None:
    check_readers(tmp_path, data)


@pytest.mark.fuzz
@settings(max_examples=LONG_EXAMPLES, **_SETTINGS)  # type: ignore[arg-type]
@given(mutated())
def test_readers_long_run(tmp_path: Path, data: bytes) -> None:
    check_machine(data)
    check_readers(tmp_path, data)


def test_a_claimed_size_is_not_allocated(tmp_path: Path) -> None:
    """A zip member that claims 4 GiB but holds a few bytes is read without allocating 4 GiB."""
    data = bytearray(SEEDS["zip"])
    pos = data.find(b"PK\x01\x02")
    struct.pack_into("<I", data, pos + 24, 0xFFFFFFF0)  # uncompressed size in the directory
    path = _write(tmp_path, bytes(data))
    _bounded(lambda: [z.read(m) for z in [open_zip(path)] for m in z.members])
    assert scan_file(path).verdict in ("clean", "error")
