"""GGUF read by ptconvert's own header parser, checked against files other tools wrote: the gguf
package's GGUFWriter (the writer llama.cpp's converters use) and llama.cpp's convert_hf_to_gguf.py
(fixtures/gguf). info and scan need no gguf package; broken files are clear input errors."""

from __future__ import annotations

import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ptconvert.formats.gguf_file import FILE_TYPES, GGML_TYPES, LongArray, read_header
from tests.conftest import run_cli

gguf = pytest.importorskip("gguf")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gguf"
Q = gguf.GGMLQuantizationType

# metadata of every value type: (key, value, type); GGUFWriter writes each as declared
METADATA: list[tuple[str, Any, Any]] = [
    ("test.u8", 200, gguf.GGUFValueType.UINT8),
    ("test.i8", -100, gguf.GGUFValueType.INT8),
    ("test.u16", 60000, gguf.GGUFValueType.UINT16),
    ("test.i16", -30000, gguf.GGUFValueType.INT16),
    ("test.u32", 4_000_000_000, gguf.GGUFValueType.UINT32),
    ("test.i32", -2_000_000_000, gguf.GGUFValueType.INT32),
    ("test.f32", 0.5, gguf.GGUFValueType.FLOAT32),
    ("test.bool", True, gguf.GGUFValueType.BOOL),
    ("test.string", "héllo, GGUF", gguf.GGUFValueType.STRING),
    ("test.u64", 2**60, gguf.GGUFValueType.UINT64),
    ("test.i64", -(2**60), gguf.GGUFValueType.INT64),
    ("test.f64", 1e-300, gguf.GGUFValueType.FLOAT64),
]
ARRAYS: dict[str, list[Any]] = {
    "test.ints": [1, -2, 3],
    "test.floats": [0.25, 1.5],
    "test.words": ["a", "bc"],
    "test.vocab": [f"tok{i}" for i in range(100)],  # long: summarised as its length
    "test.scores": [float(i) for i in range(40)],
}


def write_gguf(
    path: Path,
    tensors: dict[str, tuple[np.ndarray, Any]],
    *,
    arch: str = "testarch",
    extra: dict[str, str] | None = None,
    file_type: int | None = None,
    **writer: Any,
) -> Path:
    """A GGUF written by gguf's GGUFWriter: ``tensors`` name → (array, raw type or None)."""
    w = gguf.GGUFWriter(path, arch=arch, **writer)
    w.add_name("Test Model")
    if file_type is not None:
        w.add_file_type(file_type)
    for key, value, vtype in METADATA:
        w.add_key_value(key, value, vtype)
    for key, values in ARRAYS.items():
        w.add_array(key, values)
    for key, text in (extra or {}).items():
        w.add_string(key, text)
    for name, (array, raw) in tensors.items():
        w.add_tensor(name, array, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def mixed_tensors() -> dict[str, tuple[np.ndarray, Any]]:
    """A tensor of each plain type and three quantized ones (Q4_K: random blocks, as the gguf
    package cannot quantize into it; its dequantize reads any bytes)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    return {
        "w.f32": (x, None),
        "w.f16": (x.astype(np.float16), None),
        "w.bf16": (gguf.quants.quantize(x, Q.BF16), Q.BF16),
        "w.f64": (x[:2, :8].astype(np.float64), None),
        "w.i8": (rng.integers(-128, 127, (3, 5), dtype=np.int8), None),
        "w.i16": (rng.integers(-999, 999, (5,), dtype=np.int16), None),
        "w.i32": (rng.integers(-999, 999, (2, 2, 3), dtype=np.int32), None),
        "w.i64": (rng.integers(-999, 999, (7,), dtype=np.int64), None),
        "w.q8_0": (gguf.quants.quantize(x, Q.Q8_0), Q.Q8_0),
        "w.q4_0": (gguf.quants.quantize(x, Q.Q4_0), Q.Q4_0),
        "w.q4_k": (rng.integers(0, 255, (2, 144), dtype=np.uint8), Q.Q4_K),
    }


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    return write_gguf(
        tmp_path / "mixed.gguf",
        mixed_tensors(),
        file_type=int(gguf.LlamaFileType.MOSTLY_Q8_0),
        extra={"tokenizer.chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"},
    )


def test_type_tables_are_the_gguf_packages() -> None:
    for ggml_type, (name, block, size, _) in GGML_TYPES.items():
        assert Q(ggml_type).name == name
        assert gguf.GGML_QUANT_SIZES[Q(ggml_type)] == (block, size)
    assert set(GGML_TYPES) == {int(t) for t in Q}
    assert {int(t): t.name for t in gguf.LlamaFileType} == FILE_TYPES


def test_header_reads_as_gguf_reader_reads_it(mixed: Path) -> None:
    header = read_header(mixed)
    reader = gguf.GGUFReader(mixed)
    assert header.version == 3 and header.alignment == 32
    for key, value, _ in METADATA:
        assert header.metadata[key] == pytest.approx(reader.fields[key].contents())
        assert header.metadata[key] == (value if key != "test.f32" else pytest.approx(value))
    assert header.metadata["test.ints"] == [1, -2, 3]
    assert header.metadata["test.words"] == ["a", "bc"]
    assert header.metadata["test.vocab"] == LongArray("string", 100)
    assert header.metadata["test.scores"] == LongArray("float32", 40)
    assert header.architecture == "testarch"
    assert [t.name for t in header.tensors] == [t.name for t in reader.tensors]
    for mine, theirs in zip(header.tensors, reader.tensors, strict=True):
        assert mine.ggml_type == int(theirs.tensor_type)
        assert mine.shape == tuple(reversed(theirs.shape.tolist()))
        assert (mine.offset, mine.nbytes) == (theirs.data_offset, theirs.n_bytes)
    assert header.data_start == reader.data_offset


def test_a_custom_alignment_is_followed(tmp_path: Path) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    w = gguf.GGUFWriter(tmp_path / "a.gguf", arch="testarch")
    w.add_custom_alignment(64)
    w.add_tensor("a", x)
    w.add_tensor("b", x[:1])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    header = read_header(tmp_path / "a.gguf")
    reader = gguf.GGUFReader(tmp_path / "a.gguf")
    assert header.alignment == 64
    assert [t.offset for t in header.tensors] == [t.data_offset for t in reader.tensors]
    assert all(t.offset % 64 == 0 for t in header.tensors)


def test_info_names_types_as_gguf_does_without_the_gguf_package(
    mixed: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)  # info parses the header itself
    code, info, _ = run_cli(["info", str(mixed)], capsys)
    assert code == 0, info
    assert (info["format"], info["layout"], info["tensors"]) == ("gguf", "v3", 11)
    assert set(info["dtypes"]) == {
        "float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64",
        "Q8_0", "Q4_0", "Q4_K",
    }  # fmt: skip
    assert info["dtypes"]["Q4_K"] == {"tensors": 1, "elements": 512, "bytes": 288}  # 2 blocks
    assert info["quantized"] == {"ops": {}, "weights": {"Q4_0": 1, "Q4_K": 1, "Q8_0": 1}}
    meta = info["metadata"]
    assert (meta["GGUF.version"], meta["GGUF.tensor_count"]) == (3, 11)
    assert meta["general.architecture"] == "testarch"
    assert meta["test.string"] == "héllo, GGUF" and meta["test.u64"] == 2**60
    assert meta["test.ints"] == [1, -2, 3]
    assert meta["test.vocab"] == "<array of 100 string>"
    notes = " ".join(info["notes"])
    assert "GGUF v3, architecture testarch, name 'Test Model', file type MOSTLY_Q8_0" in notes
    assert "3 quantized tensors (Q4_0 (1), Q4_K (1), Q8_0 (1))" in notes


def test_info_reads_the_header_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 4 GiB tensor whose bytes were never written (a sparse file): info answers at once."""
    path = tmp_path / "big.gguf"
    w = gguf.GGUFWriter(path, arch="testarch")
    w.add_tensor_info("huge", (65536, 16384), np.dtype(np.float32), 4 << 30)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    with open(path, "r+b") as fh:
        fh.truncate(read_header_size(path) + (4 << 30))
    code, info, _ = run_cli(["info", str(path)], capsys)
    assert code == 0, info
    assert info["largest"][0] == {
        "name": "huge", "dtype": "float32", "shape": [65536, 16384], "numel": 1 << 30,
    }  # fmt: skip


def read_header_size(path: Path) -> int:
    """Where the data section of a GGUF whose tensors are not written yet begins."""
    data = path.read_bytes()
    return -(-len(data) // 32) * 32


def test_info_of_llama_cpps_own_files(capsys: pytest.CaptureFixture[str]) -> None:
    code, info, _ = run_cli(["info", str(FIXTURES / "tiny-llama-q8_0.gguf")], capsys)
    assert code == 0, info
    assert info["dtypes"] == {
        "Q8_0": {"tensors": 16, "elements": 106112, "bytes": 106112 // 32 * 34},
        "float32": {"tensors": 5, "elements": 320, "bytes": 1280},
    }
    assert info["metadata"]["tokenizer.ggml.tokens"] == "<array of 253 string>"
    assert info["notes"][0] == (
        "GGUF v3, architecture llama, name 'Tiny Llama', file type MOSTLY_Q8_0"
    )
    code, info, _ = run_cli(["info", str(FIXTURES / "tiny-llama-f16.gguf")], capsys)
    assert info["largest"][0]["dtype"] == "float16" and info["parameters"] == 106432


def test_scan_finds_no_pickle_and_says_so(mixed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report, _ = run_cli(["scan", str(mixed)], capsys)
    assert code == 0, report
    assert report["verdict"] == "clean"
    (scanned,) = report["files"]
    assert scanned["verdict"] == "clean" and not scanned["findings"]
    notes = " ".join(scanned["notes"])
    assert "a GGUF file (llama.cpp's format)" in notes and "holds no pickle" in notes
    assert "tokenizer.chat_template" in notes
    code, report, _ = run_cli(["scan", str(FIXTURES / "tiny-llama-f16.gguf")], capsys)
    assert report["verdict"] == "clean"
    assert "chat template" not in " ".join(report["files"][0]["notes"])


def _expect(
    capsys: pytest.CaptureFixture[str], path: Path, code: int, kind: str, words: str
) -> None:
    got, out, _ = run_cli(["info", str(path)], capsys)
    err = out["error"]
    assert (got, err["exit_code"], err["kind"]) == (code, code, kind), err
    assert err["path"] == str(path)
    assert words in err["message"], err["message"]


def test_truncated_and_corrupt_files_are_input_errors(
    mixed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = mixed.read_bytes()
    cut = tmp_path / "cut-header.gguf"
    cut.write_bytes(data[:300])
    _expect(capsys, cut, 3, "truncated", "more than a 300-byte file can hold")
    cut.write_bytes(data[:1200])
    _expect(capsys, cut, 3, "truncated", "the GGUF header ends inside")
    short = tmp_path / "cut-data.gguf"
    short.write_bytes(data[:-100])
    _expect(capsys, short, 3, "truncated", "the file is truncated")
    version = tmp_path / "version.gguf"
    version.write_bytes(data[:4] + struct.pack("<I", 99) + data[8:])
    _expect(capsys, version, 3, "corrupt", "unknown GGUF version 99")
    counts = tmp_path / "counts.gguf"
    counts.write_bytes(data[:8] + struct.pack("<Q", 2**40) + data[16:])
    _expect(capsys, counts, 3, "truncated", "1,099,511,627,776 tensors")
    string = tmp_path / "string.gguf"  # the first key's length: past the end
    string.write_bytes(data[:24] + struct.pack("<Q", 2**50) + data[32:])
    _expect(capsys, string, 3, "truncated", "metadata key 0")


def test_big_endian_and_v1_files_are_refused_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = np.ones((2, 32), dtype=np.float32)
    big = write_gguf(tmp_path / "big.gguf", {"w": (x, None)}, endianess=gguf.GGUFEndian.BIG)
    _expect(capsys, big, 4, "unsupported", "big-endian GGUF (v3)")
    code, report, _ = run_cli(["scan", str(big)], capsys)  # still no pickle: scanned clean
    assert code == 0, report
    assert report["verdict"] == "clean"
    assert "big-endian GGUF" in " ".join(report["files"][0]["notes"])
    v1 = tmp_path / "v1.gguf"
    v1.write_bytes(b"GGUF" + struct.pack("<III", 1, 0, 0) + b"\0" * 32)
    _expect(capsys, v1, 4, "unsupported", "GGUF version 1")
