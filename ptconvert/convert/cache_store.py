"""The cache's store: entries under a root folder of the user's, filled in ``tmp/`` and renamed
whole under a lock per key, copied out with their sha256 checked; an entry another user made or
could change is refused; ``info`` and ``clear``."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ptconvert import progress
from ptconvert.atomic import disk_size, open_output, place_together, temp_folder
from ptconvert.convert.cache_key import CHUNK, SCHEMA
from ptconvert.errors import CacheError
from ptconvert.report import Report

if TYPE_CHECKING:
    from ptconvert.formats.base import Format


# (2: AOTI packages check their inputs, programs wrong outside their range are narrowed)

_HINT = (
    "fix its owner or permissions, set PTCONVERT_CACHE to a directory of your own, "
    "or pass --no-cache"
)


def cache_root() -> Path:
    """``PTCONVERT_CACHE``, else the user's cache directory (XDG), under ``ptconvert``."""
    explicit = os.environ.get("PTCONVERT_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "ptconvert"


def _unusable(folder: Path, what: str) -> CacheError:
    return CacheError(f"the cache directory {what}", path=folder, hint=_HINT)


def _check_folder(folder: Path) -> None:
    """Ours, writable, and not writable by other users. Checked on the mode bits, not with
    os.access: root passes every access check, and a cache another user can write is one they
    can put artifacts in."""
    st = folder.stat()
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISDIR(st.st_mode):
        raise _unusable(folder, "is not a directory")
    if st.st_uid != os.geteuid():
        raise _unusable(folder, f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})")
    if not st.st_mode & stat.S_IWUSR or not st.st_mode & stat.S_IXUSR:
        raise _unusable(folder, f"is read-only (mode {mode:o})")
    # Group-writable is accepted: under umask 002 every folder is, and such setups give each
    # user a group of their own (user private groups). Writable by others (o+w) is every user
    # of the machine, sticky bit or not: any of them could create entries/KEY before the
    # owner does (a hit is not scanned, its sha256 is in that same folder), or fill tmp/ and
    # locks/ with their own files.
    if st.st_mode & stat.S_IWOTH:
        raise _unusable(
            folder,
            f"is writable by other users (mode {mode:o}): other users could plant programs there "
            "that conversions would hand out as verified",
        )


def _os_error(folder: Path, exc: OSError) -> CacheError:
    if exc.errno == errno.EROFS:
        return _unusable(folder, "is on a read-only filesystem")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return _unusable(folder, "cannot be written (permission denied)")
    return _unusable(folder, f"cannot be used: {exc.strerror or exc}")


def prepare(root: Path) -> None:
    for folder in (root, root / "entries", root / "locks", root / "tmp"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _os_error(folder, exc) from None
        _check_folder(folder)


@contextmanager
def locked(root: Path, key: str, mode: int, *, wait: bool = True) -> Iterator[bool]:
    """Hold ``locks/KEY.lock`` (``fcntl.LOCK_SH`` or ``LOCK_EX``); yields False, holding
    nothing, when ``wait`` is off and another process holds it. ``flock`` is released when the
    file is closed, so a process that dies holds nothing."""
    fd = _lock(root / "locks" / f"{key}.lock", mode, wait, key)
    try:
        yield fd is not None
    finally:
        if fd is not None:
            os.close(fd)


def _lock(path: Path, mode: int, wait: bool, key: str) -> int | None:
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise _os_error(path.parent, exc) from None
        try:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    os.close(fd)
                    return None
                with progress.step(f"waiting for another process using cache entry {key[:12]}"):
                    fcntl.flock(fd, mode)
            # `cache clear` removes a lock file while holding it: a lock taken on a file no
            # longer at the path guards nothing, so take the one there now
            held = os.fstat(fd)
            try:
                now: os.stat_result | None = os.stat(path)
            except FileNotFoundError:
                now = None
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_ino, now.st_dev) == (held.st_ino, held.st_dev):
            return fd
        os.close(fd)


class Corrupt(Exception):
    """An entry whose files are not what its complete.json says."""


def foreign(entry: Path) -> str | None:
    """What of the entry another user owns (the entry, complete.json, a file), or None. Such
    an entry is neither served nor replaced: its sha256 is in the same complete.json, so its
    owner chooses what it holds. Links are not followed."""
    me = os.geteuid()
    try:
        owner = entry.lstat().st_uid
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{entry} cannot be examined: {exc.strerror or exc}"
    if owner != me:
        return f"{entry} is owned by uid {owner}, not by you (uid {me})"
    if not entry.is_dir() or entry.is_symlink():
        return None  # not an entry: a miss, filled again

    problems: list[OSError] = []
    for folder, dirs, names in os.walk(entry, onerror=problems.append):
        for name in [*dirs, *names]:
            path = Path(folder) / name
            try:
                owner = path.lstat().st_uid
            except OSError as exc:
                return f"{path} cannot be examined: {exc.strerror or exc}"
            if owner != me:
                return f"{path} is owned by uid {owner}, not by you (uid {me})"
    if problems:
        return f"{entry} cannot be examined: {problems[0].strerror or problems[0]}"
    return None


def read_record(entry: Path) -> dict[str, Any] | None:
    """The entry's complete.json when the entry is whole (every file there, at its size)."""
    try:
        record = json.loads((entry / "complete.json").read_text())
        if record.get("schema") != SCHEMA or record["main"] not in record["files"]:
            return None
        for name, meta in record["files"].items():
            if (entry / "files" / name).stat().st_size != meta["size"]:
                return None
        if not isinstance(record["report"], dict):
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return dict(record)


def copy_checked(src: Path, dst: Path, expect: dict[str, Any] | None = None) -> dict[str, Any]:
    """Copy ``src`` to ``dst`` (an existing temporary path), hashing as it goes; with
    ``expect``, bytes that are not the stored ones are ``Corrupt``."""
    h = hashlib.sha256()
    size = 0
    try:
        reader = open(src, "rb")  # noqa: SIM115 (closed below; a read error is the entry's)
    except OSError as exc:
        raise Corrupt(str(exc)) from None
    with reader, open_output(dst) as writer:
        while True:
            try:
                chunk = reader.read(CHUNK)
            except OSError as exc:
                raise Corrupt(str(exc)) from None
            if not chunk:
                break
            h.update(chunk)
            size += len(chunk)
            writer.write(chunk)
    got = {"size": size, "sha256": h.hexdigest()}
    if expect is not None and (got["size"], got["sha256"]) != (expect["size"], expect["sha256"]):
        raise Corrupt(f"{src.name}: not the bytes stored")
    return got


def copy_out(
    entry: Path, record: dict[str, Any], out: Path, target: Format, replace: bool = True
) -> None:
    """Put the entry's files in place as the conversion does: each copied (its sha256 checked)
    into a private folder beside its destination (``atomic.temp_folder``), then
    ``place_together``: the companions first, the main file last (it names them), a replaced
    output's companions this one lacks removed; over existing files only with ``replace``."""
    files: dict[str, Any] = record["files"]
    main = record["main"]
    companions = target.companions(out)
    # only the target's own companions of this output, by name: never a path elsewhere
    if set(files) - {main} - {c.name for c in companions}:
        raise Corrupt("files the target does not write beside its output")
    order = [*sorted(n for n in files if n != main), main]
    moves: list[tuple[Path, Path]] = []
    with temp_folder(out) as folder, progress.step(f"copying the {target.name} from the cache"):
        for name in order:
            destination = out if name == main else out.parent / name
            moves.append((folder / name, destination))
            copy_checked(entry / "files" / name, folder / name, files[name])
        obsolete = [c for c in companions if c.name not in files]
        place_together(moves, obsolete, replace=replace)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@dataclass
class CacheEntry(Report):
    key: str
    target: str
    source: str  # the file name of the source that filled it
    bytes: int
    created: str  # UTC, ISO 8601


@dataclass
class CacheInfo(Report):
    root: str
    entries: list[CacheEntry] = field(default_factory=list)
    total_bytes: int = 0  # everything under the root, incomplete entries included
    incomplete: int = 0  # entries without a whole complete.json (refilled when next asked for)
    problem: str | None = None  # why conversions would refuse this directory (exit 12)


@dataclass
class CacheCleared(Report):
    root: str
    removed: int = 0
    freed_bytes: int = 0
    busy: list[str] = field(default_factory=list)  # keys another process holds: left alone


def info() -> CacheInfo:
    """What the cache holds, read without taking locks or writing anything."""
    root = cache_root()
    result = CacheInfo(str(root))
    if not root.exists():
        return result
    try:
        for folder in (root, root / "entries", root / "locks", root / "tmp"):
            if folder.exists():
                _check_folder(folder)
    except CacheError as exc:
        result.problem = exc.message
    entries = root / "entries"
    for entry in sorted(entries.iterdir()) if entries.is_dir() else []:
        record = read_record(entry)
        if record is None:
            result.incomplete += 1
            continue
        report = record["report"]
        result.entries.append(
            CacheEntry(
                entry.name,
                str(report.get("target_format")),
                Path(str(report.get("source"))).name,
                disk_size(entry),
                str(record.get("created_utc", "")),
            )
        )
    result.entries.sort(key=lambda e: e.created)
    result.total_bytes = disk_size(root)
    return result


def clear() -> CacheCleared:
    """Remove every entry (and leftovers of interrupted fills), each under its key's lock; an
    entry another process is filling or reading is left and named in ``busy``."""
    root = cache_root()
    result = CacheCleared(str(root))
    if not root.exists():
        return result
    prepare(root)
    found: dict[str, list[Path]] = {}
    for folder in ("entries", "tmp"):
        for path in (root / folder).iterdir():
            found.setdefault(path.name.split(".")[0], []).append(path)
    for lock in (root / "locks").glob("*.lock"):
        found.setdefault(lock.name.removesuffix(".lock"), [])
    for key, paths in sorted(found.items()):
        with locked(root, key, fcntl.LOCK_EX, wait=False) as held:
            if not held:
                result.busy.append(key)
                continue
            for path in paths:
                freed = disk_size(path)
                remove(path)
                result.freed_bytes += freed
                result.removed += path.parent.name == "entries"
            # under the lock: a process waiting on this file takes the next one (locked)
            (root / "locks" / f"{key}.lock").unlink(missing_ok=True)
    return result
