"""The scanner reads bytes as the loader that runs them reads them (the held-out red team's second
round): opcode arguments as CPython's unpickler reads them under ``torch.load``, bytes a pickle
hands to ``torch.load`` in memory as torch.load reads a stream (no tar), a tar where ``tarfile``
opens one, and any file torch.load could be handed also as the pickle it reads from byte 0."""

from __future__ import annotations

import contextlib
import io
import mmap
import pickle
import struct
import tarfile
from pathlib import Path
from typing import Any

import pytest

from ptconvert.pickles.machine import run_pickle
from ptconvert.pickles.records import Call, Global
from ptconvert.scan.analysis import Finding, analyse, verdict
from ptconvert.scan.containers import tar_opens, walk_bytes
from ptconvert.scan.scanner import scan_file

SYSTEM = b"cposix\nsystem\n(Vtouch /nonexistent/x\ntR"  # the payload, its result on the stack


def judge(data: bytes) -> tuple[str, list[Finding]]:
    findings = analyse(run_pickle(data), "x", frozenset())
    return verdict(findings), findings


def _harmless(*args: Any) -> None:
    return None


class _Recorder(pickle.Unpickler):
    """CPython's unpickler (what torch.load runs) with ``find_class`` recording, not importing."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data), encoding="utf-8")  # torch.load's default encoding
        self.asked: list[tuple[str, str]] = []

    def find_class(self, module: str, name: str) -> Any:
        self.asked.append((module, name))
        return _harmless


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"S'\\xc3\\xa9'\n0", id="string-utf8-escaped"),
        pytest.param("S'é'\n0".encode(), id="string-utf8-raw"),
        pytest.param(b"T\x02\x00\x00\x00\xc3\xa90", id="binstring-utf8"),
        pytest.param(b"U\x02\xc3\xa90", id="short-binstring-utf8"),
        pytest.param(b"Np0\x00junk\n0", id="put-stops-at-nul"),
        pytest.param(b"Np 7 \n0g7\n0", id="put-get-with-spaces"),
        pytest.param(b'S"a\\qb"\n0', id="string-invalid-escape-kept"),
    ],
)
def test_opcode_arguments_are_read_as_torch_loads_unpickler_reads_them(data: bytes) -> None:
    """Each prefix is read by CPython's unpickler (encoding='utf-8', as torch.load gives it), then
    the payload: pickletools' readers refused these before anything was imported, and a stream
    that fails before acting is dropped as 'not a pickle'."""
    stream = data + SYSTEM + b"."
    real = _Recorder(stream)
    with pytest.warns(DeprecationWarning) if b"\\q" in data else contextlib.nullcontext():
        real.load()
    assert real.asked == [("posix", "system")]
    run = run_pickle(stream)
    assert run.error is None and [(g.module, g.name) for g in run.imports] == real.asked
    assert judge(stream)[0] == "dangerous"


def test_strings_decode_as_torch_decodes_them() -> None:
    for data in (b"S'\\xc3\\xa9'\n.", b"U\x02\xc3\xa9.", b"T\x02\x00\x00\x00\xc3\xa9."):
        assert run_pickle(data).root == pickle.loads(data, encoding="utf-8") == "é"
    assert run_pickle(b"U\x01\xff.").root == "\xff"  # not UTF-8: read on (latin-1), not failed


def test_global_names_are_read_without_escapes_and_as_utf8() -> None:
    """CPython takes a GLOBAL's lines as they are (UTF-8); pickletools undid escapes (``\\x6fs``
    became ``os``) and refused any byte past ASCII."""
    run = run_pickle(b"c\\x6fs\nsystem\n.")
    assert [(g.module, g.name) for g in run.imports] == [("\\x6fs", "system")]
    run = run_pickle("cmodulé\nnäme\n.".encode())
    assert run.error is None and [(g.module, g.name) for g in run.imports] == [("modulé", "näme")]


def test_a_nul_in_a_module_name_imports_the_frozen_module_before_it() -> None:
    """The frozen-module finder compares names as C strings: ``os\\0x`` imports ``os``."""
    assert pickle.loads(b"cos\x00x\nsystem\n.") is __import__("os").system
    run = run_pickle(b"cos\x00x\nsystem\n.")
    assert [(g.module, g.name) for g in run.imports] == [("os", "system")]
    got, findings = judge(b"cos\x00x\nsystem\n(Vx\ntR.")
    assert got == "dangerous" and findings[0].global_name == "os.system"


def test_inst_finds_its_mark_before_it_imports() -> None:
    run = run_pickle(b"ios\nsystem\n.")  # no MARK: CPython fails before find_class
    assert run.error and not run.imports


def test_a_legacy_stream_whose_second_pickle_fails_is_an_error(tmp_path: Path) -> None:
    """torch.load reads the four pickles after the magic number whatever they hold: one that
    fails is not 'not a pickle' (the file was dropped as clean)."""
    path = tmp_path / "legacy.pt"
    path.write_bytes(b"L119547037146038801333356L\n." + b"\xff")
    assert scan_file(path).verdict == "error"


@pytest.mark.parametrize(
    ("opcode", "method"),
    [(b"\x90", "add"), (b"a", "append"), (b"e", "extend"), (b"e", "append")],
)
def test_adding_items_calls_the_method_a_build_set(opcode: bytes, method: str) -> None:
    """APPEND(S) on an object that is not a list calls its ``extend`` (else ``append``), ADDITEMS
    its ``add``: looked up on the instance, where a BUILD put a class of user code."""
    cls = b"cfixtures.scan_corpus\nPlanted\n"
    build = b"cargparse\nNamespace\n)R}V" + method.encode() + b"\n" + cls + b"sb"
    add = b"(V/tmp/x\n" + opcode if opcode != b"a" else b"V/tmp/x\n" + opcode
    run = run_pickle(build + add + b".")
    (call,) = [e.target for e in run.events if e.kind == "call" and e.opcode == opcode_name(opcode)]
    assert isinstance(call, Call) and isinstance(call.func, Global)
    assert call.func.name == "Planted"
    got, findings = judge(build + add + b".")
    assert got == "dangerous", findings


def opcode_name(opcode: bytes) -> str:
    return {b"\x90": "ADDITEMS", b"a": "APPEND", b"e": "APPENDS"}[opcode]


def test_every_build_adds_to_the_attributes() -> None:
    """A later BUILD does not forget what an earlier one set (CPython updates ``__dict__``)."""
    first = b"cargparse\nNamespace\n)R}Vadd\ncfixtures.scan_corpus\nPlanted\nsb"
    data = first + b"}Vlr\nI1\nsb(V/tmp/x\n\x90."
    assert judge(data)[0] == "dangerous"


class _Items(list):  # type: ignore[type-arg]
    """A list subclass with an attribute named like the method APPENDS calls."""


def test_items_pickled_before_the_state_call_nothing() -> None:
    """The pickler writes a list subclass's items (APPENDS) before its state (BUILD): an attribute
    named like a method is set after the items were added, and nothing is called."""
    items = _Items([1, 2])
    items.extend = 3  # type: ignore[method-assign,assignment]
    data = pickle.dumps(items, protocol=2)
    assert data.index(b"e}") < data.rindex(b"b")  # APPENDS, then the state and BUILD
    run = run_pickle(data)
    assert [e.opcode for e in run.events if e.kind == "call"] == ["NEWOBJ"]
    assert judge(data)[0] == "needs-code"


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(
            b"cargparse\nNamespace\n)Rcbuiltins\nobject\n)Rb(Vx\n\x90.", id="opaque-state"
        ),
        pytest.param(b"ccollections\nOrderedDict\nV/tmp/x\na.", id="append-on-global"),
        pytest.param(b"ccollections\nOrderedDict\nVk\nVv\ns.", id="setitem-on-global"),
    ],
)
def test_items_added_where_the_method_cannot_be_known_are_dangerous(data: bytes) -> None:
    assert judge(data)[0] == "dangerous"


def test_fresh_runs_fail_where_a_new_unpickler_fails() -> None:
    """The reading from byte 0 of a file read as something else: garbage stops where CPython
    stops (no memo, no extension registry, names no import resolves, a literal called)."""
    for garbage in (
        b"h\x05.",  # BINGET of a slot never written
        b"\x82\x01.",  # EXT1
        b"cx y\nz\n.",  # a module name no import resolves
        b"cos\nsys tem\n.",
        b"ctypes\x00x\nSimpleNamespace\n.",  # a NUL, and types is not frozen
        b"NN)R.",  # calling None
        b"cbuiltins\nlist\nNR.",  # arguments that are not a tuple
        b".",  # STOP on an empty stack
    ):
        assert run_pickle(garbage, fresh=True).error, garbage
        assert not run_pickle(garbage).error or garbage == b"ctypes\x00x\nSimpleNamespace\n."
    payload = b"cos\x00x\nsystem\n" + b"(Vx\ntR."
    assert run_pickle(payload, fresh=True).error is None


def _tar(first_name: str = "x", body: bytes = b"harmless") -> bytearray:
    info = tarfile.TarInfo(first_name)
    info.size, info.mtime = len(body), 0
    return bytearray(info.tobuf(format=tarfile.USTAR_FORMAT)) + body + bytes(-len(body) % 512)


def test_a_tar_is_what_tarfile_opens() -> None:
    """Checksums in GNU base-256 form and names opening with NUL: tarfile (torch's legacy loader)
    opens these; the sniffer refused them and the file was read as a pickle instead."""
    base256 = _tar()
    base256[148:156] = b" " * 8
    base256[148:156] = b"\x80" + sum(base256[:512]).to_bytes(7, "big")
    nul = _tar()
    nul[0:100] = bytes(100)
    nul[148:156] = b" " * 8
    nul[148:156] = b"%06o\0 " % sum(nul[:512])
    for data in (bytes(base256) + bytes(1024), bytes(nul) + bytes(1024)):
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            assert tar.getmembers()
        assert tar_opens(data)
    assert not tar_opens(b"\x80\x02}." + bytes(600))


def test_bytes_loaded_in_memory_are_never_read_as_a_tar() -> None:
    """``torch.load(io.BytesIO(b))`` (``_load_from_bytes``) never tries tar: a valid tar is read as
    the pickle it is from byte 0."""
    body = b"\n" + SYSTEM + b"."
    data = bytes(_tar("V", body)) + bytes(1024)
    assert tar_opens(data)
    (stream,) = walk_bytes("nested", data, 1)
    assert stream.kind == "pickle" and stream.data == data  # type: ignore[union-attr]


def test_a_safetensors_file_is_also_read_from_byte_0(tmp_path: Path) -> None:
    """torch.load of a safetensors file under any other name unpickles it from byte 0: the low
    byte of the header length is the first opcode."""
    header = b'{"w":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}'
    header = header.ljust(len(header) + (ord("V") - len(header)) % 256)
    path = tmp_path / "model.bin"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\n" + SYSTEM + b".")
    result = scan_file(path)
    assert result.verdict == "dangerous"
    (f,) = [f for f in result.findings if f.severity == "dangerous"]
    assert f.global_name == "posix.system" and "from byte 0" in f.member


def test_a_line_of_gigabytes_is_read_without_copying_it(tmp_path: Path) -> None:
    """A string that runs far into a mapped file (a safetensors header read as UNICODE, up to the
    first newline in its tensor bytes) is judged by its first MiB and its end: what follows it is
    read, even when the cut falls inside an escape."""
    from ptconvert.pickles.opcodes import _LONG_LINE

    cut = _LONG_LINE
    body = b"a" * (cut - 4) + b"\\u0041" + b"b" * (3 * cut)
    path = tmp_path / "long.bin"
    path.write_bytes(b"V" + body + b"\n0" + SYSTEM + b".")
    result = scan_file(path)
    assert result.verdict == "dangerous", result.findings
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        run = run_pickle(mm, fresh=True)
        assert run.error is None and [g.name for g in run.imports] == ["system"]
        (text,) = [e.target.args[0] for e in run.events if e.kind == "call"]
        assert text == "touch /nonexistent/x"


def test_a_length_past_the_end_of_a_mapped_file_fails_at_once(tmp_path: Path) -> None:
    path = tmp_path / "huge.bin"
    path.write_bytes(b"\x8e" + (1 << 40).to_bytes(8, "little") + bytes(64))
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        run = run_pickle(mm)
    assert run.error and "remain" in run.error
    assert "remain" in (run_pickle(b"\x8e" + (1 << 63).to_bytes(8, "little")).error or "")
