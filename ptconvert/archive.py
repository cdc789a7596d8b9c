"""A zip reader that sees archives the way torch's reader does.

torch treats a file as a zip only when it starts with a local header (``PK\x03\x04`` at byte 0);
miniz then locates members through the central directory, by name compared case-insensitively,
and skips the member's local header to reach its bytes; it ignores CRCs and most flag bits.
Python's ``zipfile`` refuses some of those archives, so a scanner built on it sees less than
torch loads. This reader follows the central directory like torch, returns exact byte offsets of
stored members (the weights fast path copies from them), and records every oddity it meets in
``anomalies`` so that the scanner can refuse an ambiguous archive instead of guessing.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from ptconvert.errors import (
    CorruptFileError,
    DecompressionLimitError,
    OutOfMemoryError,
    TruncatedFileError,
)

_EOCD = b"PK\x05\x06"
_EOCD64_LOCATOR = b"PK\x06\x07"
_EOCD64 = b"PK\x06\x06"
_CENTRAL = b"PK\x01\x02"
_LOCAL = b"PK\x03\x04"
STORED, DEFLATED = 0, 8
# The central directory of a well-formed archive cannot be larger than this many members; a
# larger claimed count is treated as corruption rather than allocated.
MAX_MEMBERS = 1_000_000
_SENTINELS = (0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)  # count, size, offset: "see the zip64 record"
# A deflated member is inflated only up to what the reader asked for (a storage's declared
# size), and not at all past this ratio once it is large: zeros deflate ~1000-fold, real
# weights hardly at all (torch.save stores its members; only a re-zipped file deflates them).
MAX_INFLATED = 1 << 30  # bytes a compressed stream or member may hold before we refuse it
MAX_RATIO = 200
RATIO_FLOOR = 16 << 20
_STEP = 16 << 20  # inflated per call: the output goes straight into its buffer


@dataclass(frozen=True)
class ZipMember:
    name: str
    compress_type: int
    compressed_size: int
    size: int
    header_offset: int
    data_offset: int
    flags: int
    crc: int

    @property
    def is_dir(self) -> bool:
        return self.name.endswith("/")


@dataclass
class ZipArchive:
    """Central directory of a zip file, read without trusting ``zipfile``."""

    path: Path
    file_size: int
    members: list[ZipMember]
    anomalies: list[str] = field(default_factory=list)
    prefix_bytes: int = 0  # bytes before the first member (data prepended to the archive)

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.members]

    def member(self, name: str) -> ZipMember | None:
        """The member torch would open for ``name`` (miniz compares names case-insensitively)."""
        want = name.lower()
        for m in self.members:
            if m.name.lower() == want:
                return m
        return None

    def root(self) -> str:
        """The top-level folder torch puts every record under (``archive/``), or ``''``."""
        first = next((m.name for m in self.members if "/" in m.name), "")
        return first.split("/", 1)[0] + "/" if first else ""

    def read(self, member: ZipMember, limit: int | None = None) -> bytes:
        """The member's uncompressed bytes (at most ``limit`` of them)."""
        if member.compress_type == STORED:
            want = member.compressed_size if limit is None else min(limit, member.compressed_size)
            return self._pread(member, want)
        if member.compress_type == DEFLATED:
            # never inflate past the declared size: a bomb stops here in bounded memory
            cap = member.size if limit is None else min(limit, member.size)
            d = zlib.decompressobj(-15)
            try:
                out = d.decompress(self.read_raw(member), cap + 1)
            except zlib.error as exc:
                raise CorruptFileError(
                    f"zip member {member.name!r} is not valid deflate data ({exc})", path=self.path
                ) from exc
            if len(out) > member.size:
                raise CorruptFileError(
                    f"zip member {member.name!r} inflates past its declared {member.size} bytes",
                    path=self.path,
                )
            return out[:cap]
        raise CorruptFileError(
            f"zip member {member.name!r} uses compression method {member.compress_type}, "
            "which torch cannot read either",
            path=self.path,
        )

    def read_raw(self, member: ZipMember) -> bytes:
        """The member's bytes as stored (compressed, for a deflated one)."""
        return self._pread(member, member.compressed_size)

    def _pread(self, member: ZipMember, want: int) -> bytes:
        if member.data_offset + member.compressed_size > self.file_size:
            raise TruncatedFileError(
                f"zip member {member.name!r} runs past the end of the file "
                f"({member.data_offset + member.compressed_size} > {self.file_size} bytes)",
                path=self.path,
            )
        with open(self.path, "rb") as fh:
            return os.pread(fh.fileno(), want, member.data_offset)

    def ratio_problem(self, member: ZipMember, size: int | None = None) -> str | None:
        """Why inflating ``size`` bytes (default: the member's declared size) of ``member`` is
        refused, or None: past ``MAX_RATIO`` times its compressed bytes, once past
        ``RATIO_FLOOR``."""
        size = member.size if size is None else size
        if member.compress_type == STORED or size <= RATIO_FLOOR:
            return None
        if size <= MAX_RATIO * max(member.compressed_size, 1):
            return None
        return (
            f"zip member {member.name!r} inflates {size / max(member.compressed_size, 1):,.0f}-"
            f"fold ({size:,} bytes from {member.compressed_size:,}), past the {MAX_RATIO}-fold "
            "limit (a decompression bomb?)"
        )

    def inflate(self, member: ZipMember, size: int) -> bytearray:
        """The first ``size`` bytes of ``member`` (a storage's declared size: never more), in
        one buffer: bounded by the ratio limit, and said as out of memory before the buffer
        is allocated when the machine has less free."""
        if member.compress_type == STORED:
            self._pread(member, 0)  # the member's bounds checked
            return read_exact(self.path, member.data_offset, min(size, member.compressed_size))
        why = self.ratio_problem(member, size)
        if why is not None:
            raise DecompressionLimitError(
                why,
                path=self.path,
                hint="re-save it with torch.save (which stores members as they are), if you "
                "trust where it came from",
            )
        _room_for(size, self.path, member.name)
        self._pread(member, 0)  # the member's bounds checked
        out = bytearray(size)
        view, done = memoryview(out), 0
        d = zlib.decompressobj(-15)
        at, left, pending = member.data_offset, member.compressed_size, b""
        with open(self.path, "rb") as fh:
            try:
                while done < size and not d.eof:
                    if not pending:  # the compressed bytes are read in steps too
                        if not left:
                            break
                        pending = os.pread(fh.fileno(), min(_STEP, left), at)
                        if not pending:
                            break  # the file ends early (it shrank): said below
                        at, left = at + len(pending), left - len(pending)
                    chunk = d.decompress(pending, min(_STEP, size - done))
                    pending = d.unconsumed_tail
                    view[done : done + len(chunk)] = chunk
                    done += len(chunk)
            except zlib.error as exc:
                raise CorruptFileError(
                    f"zip member {member.name!r} is not valid deflate data ({exc})",
                    path=self.path,
                ) from exc
        if done < size:
            raise TruncatedFileError(
                f"zip member {member.name!r} inflates to {done} bytes, less than the {size} "
                "its storage declares",
                path=self.path,
            )
        return out


def read_exact(path: Path, offset: int, size: int) -> bytearray:
    """``size`` bytes of ``path`` from ``offset``, read straight into one buffer."""
    _room_for(size, path, f"{size:,} bytes of it")
    out = bytearray(size)
    view, done = memoryview(out), 0
    with open(path, "rb") as fh:
        while done < size:
            n = os.preadv(fh.fileno(), [view[done:]], offset + done)
            if n == 0:
                raise TruncatedFileError(
                    f"the file ends {size - done} bytes before the data it declares", path=path
                )
            done += n
    return out


def _room_for(size: int, path: Path, what: str) -> None:
    """Out of memory said before a buffer of ``size`` bytes is allocated, not as its failure."""
    from ptconvert.memory import available_bytes

    free = available_bytes()
    if free is not None and size > free:
        raise OutOfMemoryError(
            f"reading {what} needs {size:,} bytes of memory and {free:,} are available",
            path=path,
            hint="free memory, raise the memory limit, or use a larger machine",
        )


def is_zip(head: bytes) -> bool:
    """Whether torch reads this file as a zip archive (``_is_zipfile``: a local header first)."""
    return head.startswith(_LOCAL)


def is_tar(head: bytes) -> bool:
    """A tar header as ``tarfile`` (and so torch's legacy loader) accepts it: by its checksum,
    with or without the ustar magic (V7, ustar, GNU and pax headers)."""
    if len(head) < 512 or head[:1] == b"\0":
        return False
    try:
        claimed = int(head[148:156].split(b"\0", 1)[0].strip() or b"-1", 8)
    except ValueError:
        return False
    block = bytearray(head[:512])
    block[148:156] = b" " * 8
    return claimed in (sum(block), sum(b - 256 if b > 127 else b for b in block))


def has_zip_tail(tail: bytes) -> bool:
    """Whether the file ends with an end-of-central-directory record (and its comment): a zip
    appended to other data. A zip merely embedded in a pickle is followed by more opcodes."""
    pos = tail.rfind(_EOCD)
    if pos < 0 or len(tail) - pos < 22:
        return False
    (comment,) = struct.unpack("<H", tail[pos + 20 : pos + 22])
    return pos + 22 + comment == len(tail)


def _find_eocd(fh_fd: int, size: int) -> tuple[int, bytes]:
    span = min(size, 65535 + 22)
    tail = os.pread(fh_fd, span, size - span)
    pos = tail.rfind(_EOCD)
    if pos < 0 or len(tail) - pos < 22:
        raise CorruptFileError("not a zip archive: no end-of-central-directory record")
    return size - span + pos, tail[pos : pos + 22]


def open_zip(path: str | Path) -> ZipArchive:
    """Read the central directory of ``path``. Raises CorruptFileError on a broken archive."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as fh:
        fd = fh.fileno()
        try:
            eocd_pos, eocd = _find_eocd(fd, size)
        except CorruptFileError as exc:
            raise CorruptFileError(exc.message, path=path) from None
        (_, _disk, _cd_disk, _n_here, count, cd_size, cd_offset, _clen) = struct.unpack(
            "<4sHHHHIIH", eocd
        )
        end_of_cd = eocd_pos
        anomalies: list[str] = []
        zip64 = _read_zip64_eocd(fd, eocd_pos)
        if isinstance(zip64, str):
            anomalies.append(f"readers disagree: {zip64}")
            zip64 = None
        if zip64 is not None:
            plain = (count, cd_size, cd_offset)
            end_of_cd, count, cd_size, cd_offset = zip64
            for kept, wide, sentinel in zip(
                plain, (count, cd_size, cd_offset), _SENTINELS, strict=True
            ):
                if kept not in (sentinel, wide):
                    anomalies.append("readers disagree: the zip and zip64 end records differ")
                    break
        elif 0xFFFFFFFF in (cd_size, cd_offset) or count == 0xFFFF:
            raise CorruptFileError("zip64 archive without its end-of-directory records", path=path)
        # Data before the archive shifts every offset; miniz corrects for it the same way.
        shift = end_of_cd - (cd_offset + cd_size)
        if shift < 0:
            raise TruncatedFileError(
                "zip central directory points past its own end record (truncated file?)", path=path
            )
        if shift:
            anomalies.append(f"{shift} bytes of other data precede the zip archive")
        if count > MAX_MEMBERS:
            raise CorruptFileError(f"zip claims {count} members", path=path)
        cd = os.pread(fd, cd_size, cd_offset + shift)
        if len(cd) < cd_size:
            raise TruncatedFileError("zip central directory is truncated", path=path)
        members: list[ZipMember] = []
        pos = 0
        seen: set[str] = set()
        for _ in range(count):
            if cd[pos : pos + 4] != _CENTRAL:
                raise CorruptFileError("zip central directory entry is malformed", path=path)
            (flags, method, crc, csize, usize, nlen, xlen, clen, lh_off) = struct.unpack(
                "<8xHH4xIIIHHH8xI", cd[pos : pos + 46]
            )
            name = cd[pos + 46 : pos + 46 + nlen].decode("utf-8", "replace")
            extra = cd[pos + 46 + nlen : pos + 46 + nlen + xlen]
            pos += 46 + nlen + xlen + clen
            if 0xFFFFFFFF in (csize, usize, lh_off):
                usize, csize, lh_off = _zip64_extra(extra, usize, csize, lh_off)
            lh_off += shift
            local = os.pread(fd, 30, lh_off)
            if len(local) < 30 or local[:4] != _LOCAL:
                raise CorruptFileError(f"zip member {name!r} has no local header", path=path)
            lflags, lnlen, lxlen = struct.unpack("<6xH18xHH", local)
            lname = os.pread(fd, lnlen, lh_off + 30).decode("utf-8", "replace")
            if lname != name:
                anomalies.append(f"member {name!r}: local header names it {lname!r}")
            if flags & ~0x0808 or lflags != flags:
                anomalies.append(f"member {name!r}: unusual flag bits 0x{flags:04x}/0x{lflags:04x}")
            if name.lower() in seen:
                anomalies.append(
                    f"member {name!r} appears more than once (names compare ignoring case)"
                )
            seen.add(name.lower())
            if name.startswith(("/", "\\")) or ".." in name.replace("\\", "/").split("/"):
                anomalies.append(f"member {name!r} escapes the archive (absolute or '..' path)")
            members.append(
                ZipMember(
                    name, method, csize, usize, lh_off, lh_off + 30 + lnlen + lxlen, flags, crc
                )
            )
    return ZipArchive(path, size, members, anomalies, prefix_bytes=shift)


def _read_zip64_eocd(fd: int, eocd_pos: int) -> tuple[int, int, int, int] | str | None:
    """(position, member count, directory size, directory offset) from the zip64 records, None
    without them, or why a locator that leads nowhere makes the archive ambiguous (readers
    differ in where they look next)."""
    if eocd_pos < 20:
        return None
    loc = os.pread(fd, 20, eocd_pos - 20)
    if loc[:4] != _EOCD64_LOCATOR:
        return None
    (claimed,) = struct.unpack("<8xQ4x", loc)
    rec = os.pread(fd, 56, claimed) if claimed < eocd_pos else b""
    if rec[:4] != _EOCD64:
        return "its zip64 locator does not point at a zip64 end record"
    count, cd_size, cd_offset = struct.unpack("<32xQQQ", rec)
    return claimed, count, cd_size, cd_offset


def _zip64_extra(extra: bytes, usize: int, csize: int, offset: int) -> tuple[int, int, int]:
    pos = 0
    while pos + 4 <= len(extra):
        tag, ln = struct.unpack("<HH", extra[pos : pos + 4])
        body = extra[pos + 4 : pos + 4 + ln]
        if tag == 0x0001:
            vals = list(struct.unpack(f"<{len(body) // 8}Q", body[: len(body) // 8 * 8]))
            if usize == 0xFFFFFFFF and vals:
                usize = vals.pop(0)
            if csize == 0xFFFFFFFF and vals:
                csize = vals.pop(0)
            if offset == 0xFFFFFFFF and vals:
                offset = vals.pop(0)
        pos += 4 + ln
    return usize, csize, offset
