"""Pickle opcodes and their arguments, read as CPython's C unpickler (the one ``torch.load`` runs)
reads them, from bytes or a mapped file.

Apart from the machine (``machine.py``) that gives the opcodes their meaning: this is where the
bytes become (opcode, argument, offset), with the C unpickler's leniency (``I0x10``, a NUL in a
line, a STRING that is not ASCII) and without copying a huge line out of a mapped file.
"""

from __future__ import annotations

import codecs
import mmap
import pickletools
import sys
import warnings
from typing import Any


def read_ops(stream: Any) -> Any:
    """(opcode, argument, offset) like ``pickletools.genops``, but with every argument read as
    CPython's C unpickler (the one ``torch.load`` runs) reads it: ``pickletools`` refuses
    ``I0x10``, ``p0\\0junk`` or a STRING that is not ASCII, which that unpickler accepts, and
    it reads GLOBAL names with escapes undone, which the unpickler does not."""
    while True:
        pos = stream.tell()
        code = stream.read(1)
        if not code:
            raise ValueError("pickle exhausted before seeing STOP")
        op = _CODE2OP.get(code.decode("latin-1"))
        if op is None:
            raise ValueError(f"unknown opcode {code!r} at offset {pos}")
        reader = _C_READERS.get(op.name)
        if reader is not None:
            arg: Any = reader(stream)
        else:
            arg = op.arg.reader(stream) if op.arg is not None else None
        yield op, arg, pos


# A line longer than this, in a mapped file, is not copied whole: what it makes (a name, a string
# value) is judged by its first MiB and its last bytes (a safetensors header read as a string
# runs to the first newline in the tensor data, which may be gigabytes away).
_LONG_LINE = 1 << 20


class _Long(bytes):
    """A line cut to its first ``_LONG_LINE`` bytes and its last 16 (its newline kept)."""


def _readline(stream: Any) -> bytes:
    if not isinstance(stream, mmap.mmap):
        return bytes(stream.readline())
    start = stream.tell()
    end = stream.find(b"\n", start)
    if end < 0:  # no newline: the reader fails, as CPython's does
        stream.seek(0, 2)
        return stream[start : start + _LONG_LINE]
    stream.seek(end + 1)
    if end - start < _LONG_LINE:
        return stream[start : end + 1]
    return _Long(stream[start : start + _LONG_LINE] + stream[end - 16 : end + 1])


def _take(stream: Any, n: int) -> bytes:
    """``n`` bytes, never copied from a mapped file when fewer remain (a length read from
    garbage may claim the whole file)."""
    if n > sys.maxsize or (isinstance(stream, mmap.mmap) and n > len(stream) - stream.tell()):
        raise ValueError(f"expected {n} bytes, more than remain")
    data = stream.read(n)
    if len(data) < n:
        raise ValueError(f"expected {n} bytes, but only {len(data)} remain")
    return bytes(data)


def _text_line(stream: Any, what: str) -> bytes:
    line = _readline(stream)
    if not line.endswith(b"\n"):
        raise ValueError(f"no newline found when trying to read {what}")
    return _Long(line[:-1]) if isinstance(line, _Long) else line[:-1]


def _py2_text(raw: bytes) -> str:
    """A Python 2 string (STRING, BINSTRING, SHORT_BINSTRING) as ``torch.load`` decodes it: its
    unpickler is given ``encoding="utf-8"``. Bytes that are not UTF-8 (torch fails there; an
    unpickler given ``encoding="latin1"`` does not) are read as latin-1, so that the reading goes
    on wherever some unpickler goes on."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _read_string(stream: Any) -> str:
    """STRING (``load_string``): a quoted line, escapes undone as ``PyBytes_DecodeEscape`` does."""
    body = _text_line(stream, "a STRING")
    if len(body) < 2 or body[:1] != body[-1:] or body[:1] not in (b"'", b'"'):
        raise ValueError("the STRING opcode argument must be quoted")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # an invalid escape is kept as is
        try:
            raw = codecs.escape_decode(body[1:-1])[0]
        except ValueError:
            if not isinstance(body, _Long):
                raise
            raw = body[1:-1]  # cut inside an escape: the value is judged by its bytes
    return _py2_text(raw)


def _read_unicode(stream: Any) -> str:
    """UNICODE: a line in raw-unicode-escape (a cut one decoded leniently)."""
    body = _text_line(stream, "a UNICODE string")
    return str(body, "raw-unicode-escape", "replace" if isinstance(body, _Long) else "strict")


def _counted(width: int, kind: str) -> Any:
    """The length-prefixed arguments (little-endian unsigned lengths, as CPython reads them):
    ``kind`` is "py2" (BINSTRING, SHORT_BINSTRING), "str", "bytes" or "bytearray"."""

    def read(stream: Any) -> Any:
        n = int.from_bytes(_take(stream, width), "little")
        data = _take(stream, n)
        if kind == "py2":
            return _py2_text(data)
        if kind == "str":
            return data.decode("utf-8", "surrogatepass")
        return bytearray(data) if kind == "bytearray" else data

    return read


def _read_long4(stream: Any) -> int:
    n = int.from_bytes(_take(stream, 4), "little", signed=True)
    if n < 0:
        raise ValueError("LONG pickle has negative byte count")
    return int.from_bytes(_take(stream, n), "little", signed=True)


def _names(encoding: str) -> Any:
    """GLOBAL (UTF-8) and INST (ASCII): two lines, neither empty, no escapes undone."""

    def read(stream: Any) -> tuple[str, str]:
        module = _text_line(stream, "a module name")
        name = _text_line(stream, "a global name") if module else b""
        if not module or not name:
            raise ValueError("pickle data was truncated (an empty name)")
        return module.decode(encoding), name.decode(encoding)

    return read


def _line(stream: Any) -> bytes:
    line = _readline(stream)
    if not line.endswith(b"\n"):
        raise ValueError("no newline found when trying to read a text number")
    return bytes(line[:-1].split(b"\0", 1)[0])  # C string functions stop at a NUL


def _c_int(text: bytes) -> int | bool:
    """``load_int``: "00"/"01" are booleans, else strtol with base 0 (hex, octal, decimal)."""
    if text in (b"00", b"01"):
        return text == b"01"
    body = text.lstrip(b" \t\n\r\f\v")
    sign = -1 if body[:1] == b"-" else 1
    body = body[1:] if body[:1] in (b"-", b"+") else body
    if body[:2].lower() == b"0x":
        return sign * int(body[2:], 16)
    if body[:1] == b"0" and len(body) > 1:
        return sign * int(body[1:], 8)
    return sign * int(body, 10)


def _c_long(text: bytes) -> int:
    """``load_long``: a trailing L is dropped, then Python's int() with base 0."""
    return int(text[:-1] if text.endswith(b"L") else text, 0)


def _c_float(text: bytes) -> float:
    return float(text)


def _c_decimal(text: bytes) -> int:
    """PUT and GET: ``PyLong_FromString(s, NULL, 10)``, which stops at a NUL like ``_line``."""
    return int(text, 10)


def _text_number(parse: Any) -> Any:
    return lambda stream: parse(_line(stream))


_C_READERS: dict[str, Any] = {
    "INT": _text_number(_c_int),
    "LONG": _text_number(_c_long),
    "FLOAT": _text_number(_c_float),
    "PUT": _text_number(_c_decimal),
    "GET": _text_number(_c_decimal),
    "STRING": _read_string,
    "BINSTRING": _counted(4, "py2"),
    "SHORT_BINSTRING": _counted(1, "py2"),
    "UNICODE": _read_unicode,
    "BINUNICODE": _counted(4, "str"),
    "SHORT_BINUNICODE": _counted(1, "str"),
    "BINUNICODE8": _counted(8, "str"),
    "BINBYTES": _counted(4, "bytes"),
    "SHORT_BINBYTES": _counted(1, "bytes"),
    "BINBYTES8": _counted(8, "bytes"),
    "BYTEARRAY8": _counted(8, "bytearray"),
    "LONG4": _read_long4,
    "GLOBAL": _names("utf-8"),
    "INST": _names("ascii"),
    "PERSID": lambda stream: _text_line(stream, "a persistent id").decode("ascii"),
}
_CODE2OP = {op.code: op for op in pickletools.opcodes}
