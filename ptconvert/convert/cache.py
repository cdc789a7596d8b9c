"""The cache of slow artifacts: programs (pt2, TorchScript, AOTInductor, ONNX) that took an
export, a compile and a parity check to make, kept by a content hash of what made them.

Layout under the root (``PTCONVERT_CACHE``, else ``$XDG_CACHE_HOME/ptconvert`` or
``~/.cache/ptconvert``)::

    entries/KEY/files/NAME…      the artifact: the main file and its companions (ONNX data)
    entries/KEY/complete.json    written last: the stored report, sizes and sha256 of each file
    locks/KEY.lock               flock'ed while one process fills or reads the entry
    tmp/KEY.XXXX/                an entry being filled; renamed whole onto entries/KEY

Processes converting the same model at once must neither corrupt an entry nor read half of one:
an entry is filled in ``tmp/`` and renamed into place whole, with ``complete.json`` written after
every file, and only by the process that holds the key's lock exclusively (the others wait, then
find it complete). An entry is only ever made from a conversion whose parity check passed, and
its bytes are checked against the stored sha256 as they are copied out: a corrupt, incomplete or
unreadable entry is a miss and is filled again.

A hit is neither scanned nor loaded, and the sha256 it is checked against lies in the entry
itself: whoever can write an entry chooses what users run. So a cache folder that other users
can write is refused (exit 12), an entry any of whose paths another user owns is neither served
nor replaced, and a source whose loading imports classes (a whole pickled module, ``--trust``)
is not cached at all: the source of those classes is not part of the key.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import importlib.machinery
import json
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ptconvert import progress
from ptconvert.atomic import disk_size, open_output, place_together, temp_folder
from ptconvert.convert.conversion_report import ConversionReport
from ptconvert.deps import PLUGIN_GROUP
from ptconvert.errors import CacheError, PtconvertError
from ptconvert.formats import FORMATS_BY_NAME, Detection
from ptconvert.options import Options
from ptconvert.report import Report

if TYPE_CHECKING:
    from ptconvert.formats.base import Format

SCHEMA = 2  # of complete.json and of the key: a change makes every older entry a miss
# (2: AOTI packages check their inputs, programs wrong outside their range are narrowed)
_CHUNK = 1 << 20

# Options that do not change the artifact's bytes, each with why. Every other field is in the
# key, so an option added later is keyed by default (a stale hit is worse than a miss).
NOT_IN_KEY: dict[str, str] = {
    "force": "replacing an existing output changes where the artifact goes, not what it is",
    "force_memory": "the memory estimate decides whether to start, not what is written",
    "verify": "an entry is stored only verified; a --no-verify run may use one",
    "cache": "whether to use the cache at all",
}

# Packages whose version changes what a conversion writes (when installed).
KEYED_PACKAGES = (
    "ptconvert",
    "torch",
    "transformers",
    "onnx",
    "onnxruntime",
    "onnxscript",
    "executorch",
)

# Environment variables that change what torch.compile / Inductor / export produce: every one
# set with these prefixes is in the key, by name and value.
KEYED_ENVIRONMENT = ("TORCHINDUCTOR_", "TORCH_COMPILE_")
NOT_KEYED_ENVIRONMENT = {
    # where compiled kernels are kept, not what they are; and torch sets it in os.environ at
    # its first compile, which would make a process's later conversions other keys
    "TORCHINDUCTOR_CACHE_DIR": "torch sets it itself",
}

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


# --- the key --------------------------------------------------------------------------------


def _hash_file(path: Path, h: Any) -> int:
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size


def _content(path: Path) -> str | None:
    try:
        h = hashlib.sha256()
        _hash_file(path, h)
        return h.hexdigest()
    except OSError:  # the conversion says what is wrong with it
        return None


def _source_files(d: Detection) -> list[tuple[str, Path]]:
    """(name in the key, path) of every file the source is: each file of a directory by its
    relative name, hidden ones left out (``.git`` holds a second copy of LFS weights, and
    ``.cache/huggingface`` download records: neither is read to load the model); a file with
    the files it names (the shards of an index), the file itself unnamed so that a renamed copy
    is the same source."""
    src = d.path
    if src.is_dir():
        found = [
            (p.relative_to(src).as_posix(), p)
            for p in src.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(src).parts)
        ]
        return sorted(found)
    files: list[tuple[str, Path]] = [("", src)]
    try:
        listed = [Path(f["path"]) for f in d.handler.info(d.path, d.layout).files]
    except PtconvertError:
        listed = []
    for path in listed:
        if path.exists() and not path.samefile(src):
            name = os.path.relpath(path, src.parent)
            files.append((Path(name).as_posix(), path))
    return [files[0], *sorted(files[1:])]


def _module_file(module: str) -> Path | None:
    """The source file of ``pkg.module`` found without running it (``importlib.util.find_spec``
    imports the parent packages): the module imported already, else a walk of the path
    finder, from the current directory as the model spec imports it. Not covered: what that
    module imports, data files its factory reads, and modules only a custom import hook finds
    (some editable installs): a change there is not a miss until something keyed changes."""
    loaded = sys.modules.get(module)
    if loaded is not None and getattr(loaded, "__file__", None):
        return Path(loaded.__file__)  # type: ignore[arg-type]
    cwd = str(Path.cwd())
    search: list[str] | None = list(sys.path)
    if "" not in sys.path and cwd not in sys.path:
        search = [cwd, *sys.path]
    spec = None
    parts = module.split(".")
    for i in range(len(parts)):
        if search is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), search)
        if spec is None:
            return None
        locations = spec.submodule_search_locations
        search = list(locations) if locations is not None else None
    if spec is None or not spec.has_location or spec.origin is None:
        return None
    return Path(spec.origin)


def _model_key(model: str | None) -> dict[str, Any]:
    if not model:
        return {"model": None}
    target, sep, name = model.rpartition(":")
    if target.endswith(".py"):  # the file's content, not where it lies
        return {"model": f"{_content(Path(target))}:{name}"}
    path = _module_file(target) if sep else None
    return {"model": model, "model_source": _content(path) if path else None}


def _cpu() -> str | None:
    """The instruction sets of this CPU (Linux): native code is compiled for them."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line for line in fh if line.startswith(("flags", "Features"))), "")
    except OSError:
        return None
    return hashlib.sha256(flags.encode()).hexdigest()[:16]


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {"python": "{}.{}".format(*sys.version_info[:2])}
    for name in KEYED_PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    import torch

    # with its build tag: the CPU and a CUDA build of one release compile differently
    found["torch"] = str(torch.__version__)
    return found


def _environment() -> dict[str, str]:
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(KEYED_ENVIRONMENT) and k not in NOT_KEYED_ENVIRONMENT
    }


def _plugins() -> list[dict[str, str | None]]:
    """The installed plugins: each entry point with the name and version of the distribution
    that provides it (an editable install's edits keep its version: not a miss)."""
    import importlib.metadata

    found = []
    for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        dist = getattr(ep, "dist", None)
        found.append(
            {
                "entry_point": f"{ep.name}={ep.value}",
                "dist": getattr(dist, "name", None),
                "version": getattr(dist, "version", None),
            }
        )
    return sorted(found, key=lambda p: json.dumps(p, sort_keys=True))


def _gpu() -> dict[str, Any]:
    """The GPU a ``--device cuda`` program is compiled and checked on, and the CUDA torch was
    built with; ``seen: False`` when torch sees none (the conversion will say so)."""
    import torch

    if not torch.cuda.is_available():
        return {"seen": False}
    return {
        "seen": True,
        "name": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
    }


def imported_code(d: Detection) -> list[str]:
    """The classes (and functions) loading the source imports: a whole pickled module's class,
    its layers, anything a ``--trust`` pickle names. Their source is not in the key, so a
    conversion with any is not cached. ``["?"]`` when the source cannot be described."""
    from ptconvert.formats import describe

    try:
        return sorted(describe(d.path).needs_code)
    except Exception:  # a plugin format's info may fail its own way: not cached
        return ["?"]


def cache_key(d: Detection, to: str, out: Path, opts: Options) -> tuple[str, dict[str, Any]]:
    """What determines this conversion's output: the public way to ask it (the cache keys its
    entries by it; ``convert_many``'s manifest records it to skip an output whose key is
    unchanged). Returns the key (a sha256, hex) of converting the detected source ``d`` to
    ``to`` onto ``out`` with ``opts``, and the document it hashes (kept in a cache entry for
    ``cache info``): the source's content, the ``--model`` and ``--example-inputs`` files, every
    option but ``NOT_IN_KEY``, the versions of ``KEYED_PACKAGES`` and of the installed plugins,
    the ``KEYED_ENVIRONMENT`` variables, the CPU (native code) or GPU (``--device cuda``).

    Not covered, so a changed output with the same key: what a ``pkg.module:factory`` module
    imports, and the source of the classes loading the input imports, listed in the document's
    ``imports_code`` (a whole pickled module, ``--trust``). When ``imports_code`` is non-empty
    the key does not determine the output: the cache does not keep such a conversion, and a
    caller should not treat an equal key as an equal output either."""
    return _key(d, to, out, opts, imported_code(d))


def _key(
    d: Detection, to: str, out: Path, opts: Options, imports: list[str]
) -> tuple[str, dict[str, Any]]:
    target = FORMATS_BY_NAME[to]
    source = hashlib.sha256()
    total = 0
    files = _source_files(d)
    for name, path in files:
        source.update(f"{len(name)}:{name}:".encode())
        file_hash = hashlib.sha256()
        total += _hash_file(path, file_hash)
        source.update(file_hash.digest())
    options = {
        f.name: getattr(opts, f.name)
        for f in dataclasses.fields(Options)
        if f.name not in NOT_IN_KEY and f.name not in ("model", "example_inputs")
    }
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "target": to,
        "source": {"sha256": source.hexdigest(), "files": len(files), "bytes": total},
        **_model_key(opts.model),
        "example_inputs": _content(opts.example_inputs) if opts.example_inputs else None,
        "options": options,
        "versions": _versions(),
        "plugins": _plugins(),
        "environment": _environment(),
        "imports_code": imports,
    }
    if opts.device == "cuda":
        doc["gpu"] = _gpu()
    if target.companions(out):  # the main file names its companions by the output's name
        doc["output_name"] = out.name
    if target.runs_native_code:
        doc["cpu"] = _cpu()
    text = json.dumps(doc, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest(), json.loads(text)


# --- the directory and its locks --------------------------------------------------------------


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


def _prepare(root: Path) -> None:
    for folder in (root, root / "entries", root / "locks", root / "tmp"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _os_error(folder, exc) from None
        _check_folder(folder)


@contextmanager
def _locked(root: Path, key: str, mode: int, *, wait: bool = True) -> Iterator[bool]:
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


# --- entries ---------------------------------------------------------------------------------


class _Corrupt(Exception):
    """An entry whose files are not what its complete.json says."""


def _foreign(entry: Path) -> str | None:
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


def _record(entry: Path) -> dict[str, Any] | None:
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


def _copy(src: Path, dst: Path, expect: dict[str, Any] | None = None) -> dict[str, Any]:
    """Copy ``src`` to ``dst`` (an existing temporary path), hashing as it goes; with
    ``expect``, bytes that are not the stored ones are ``_Corrupt``."""
    h = hashlib.sha256()
    size = 0
    try:
        reader = open(src, "rb")  # noqa: SIM115 (closed below; a read error is the entry's)
    except OSError as exc:
        raise _Corrupt(str(exc)) from None
    with reader, open_output(dst) as writer:
        while True:
            try:
                chunk = reader.read(_CHUNK)
            except OSError as exc:
                raise _Corrupt(str(exc)) from None
            if not chunk:
                break
            h.update(chunk)
            size += len(chunk)
            writer.write(chunk)
    got = {"size": size, "sha256": h.hexdigest()}
    if expect is not None and (got["size"], got["sha256"]) != (expect["size"], expect["sha256"]):
        raise _Corrupt(f"{src.name}: not the bytes stored")
    return got


def _copy_out(
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
        raise _Corrupt("files the target does not write beside its output")
    order = [*sorted(n for n in files if n != main), main]
    moves: list[tuple[Path, Path]] = []
    with temp_folder(out) as folder, progress.step(f"copying the {target.name} from the cache"):
        for name in order:
            destination = out if name == main else out.parent / name
            moves.append((folder / name, destination))
            _copy(entry / "files" / name, folder / name, files[name])
        obsolete = [c for c in companions if c.name not in files]
        place_together(moves, obsolete, replace=replace)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@dataclass
class Slot:
    """One conversion's place in the cache. ``hit`` is the stored record when the artifact was
    copied out of the cache onto the output; otherwise ``store`` keeps the conversion's result,
    when this slot holds the key's lock (``filling``)."""

    root: Path | None = None
    key: str = ""
    out: Path | None = None
    target: Format | None = None
    hit: dict[str, Any] | None = None
    filling: bool = False
    key_inputs: dict[str, Any] = field(default_factory=dict)
    note: str | None = None  # why the cache was not used (said in the report)
    replace: bool = False  # a hit copied onto an existing output replaces it (--force)

    def report(self, src: Path, started: float) -> ConversionReport:
        """The stored report, for this source and output, saying where it came from."""
        assert self.hit is not None and self.out is not None
        return _report(self.hit, src, self.out, started, self.key)

    def store(self, report: ConversionReport) -> ConversionReport:
        """Keep a verified result (the parity check ran and passed); a failure to store it
        is a note, not a failed conversion: the output is written."""
        if self.note and self.note not in report.notes:
            report.notes.append(self.note)
        if not self.filling or report.check != "parity" or report.cached:
            return report
        assert self.root is not None and self.out is not None and self.target is not None
        try:
            with progress.step("storing the result in the cache"):
                _fill(self, report)
        except OSError as exc:
            report.notes.append(f"not stored in the cache {self.root}: {exc.strerror or exc}")
        return report


def _fill(slot: Slot, report: ConversionReport) -> None:
    assert slot.root is not None and slot.out is not None and slot.target is not None
    out = slot.out
    written = [out, *(c for c in slot.target.companions(out) if c.exists())]
    tmp = Path(tempfile.mkdtemp(prefix=f"{slot.key}.", dir=slot.root / "tmp"))
    try:
        (tmp / "files").mkdir()
        files = {p.name: _copy(p, tmp / "files" / p.name) for p in written}
        now = time.time()
        record = {
            "schema": SCHEMA,
            "key": slot.key,
            "created": now,
            "created_utc": datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
            "main": out.name,
            "files": files,
            "key_inputs": slot.key_inputs,
            "report": report.to_dict(),
        }
        # written after every file, and the folder renamed whole: an entry with a
        # complete.json is complete
        (tmp / "complete.json").write_text(json.dumps(record, indent=1, default=str))
        entry = slot.root / "entries" / slot.key
        foreign = _foreign(entry)  # found before the fill began; here too, to be sure
        if foreign:
            raise OSError(f"{foreign}: left as it is")
        # (tmp is mkdtemp's, mode 0700: no other user can reach a file of the entry)
        # incomplete or corrupt (a whole one was a hit), and the folders of fills that died:
        # this process holds the key's lock, no other is filling it
        for stale in [entry, *(slot.root / "tmp").glob(f"{slot.key}.*")]:
            if stale != tmp and stale.exists():
                _remove(stale)
        os.replace(tmp, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _report(
    record: dict[str, Any], src: Path, out: Path, started: float, key: str
) -> ConversionReport:
    """The stored report (``ConversionReport.from_dict``: every field it has, nested results
    rebuilt) as this run's: the source and output the user named, the time this copy took."""
    stored = ConversionReport.from_dict(record["report"])
    note = (
        f"from the cache (entry {key[:12]}, verified {record.get('created_utc', '?')}, its "
        "bytes checked against the stored sha256): the steps and the parity check are those "
        "of the conversion that filled it"
    )
    return dataclasses.replace(
        stored,
        source=str(src),
        output=str(out),
        seconds=round(time.perf_counter() - started, 3),
        notes=[*stored.notes, note],
        bench=None,
        cached=True,
    )


def _hit(slot: Slot, entry: Path) -> bool:
    """Copy a whole entry out and check that its report reads back; False when it is not
    whole (a miss), or is another user's (a miss that is not filled: ``slot.note`` says why)."""
    foreign = _foreign(entry)
    if foreign:
        slot.note = (
            f"not from the cache, nor stored in it: {foreign}; an entry another user made (or "
            "could change) is neither used nor replaced (remove it, or set PTCONVERT_CACHE "
            "to a directory of your own)"
        )
        return False
    record = _record(entry)
    if record is None:
        return False
    assert slot.out is not None and slot.target is not None
    try:
        _report(record, entry, slot.out, 0.0, slot.key)  # a report that no longer reads
    except (KeyError, TypeError, ValueError):
        return False
    try:
        _copy_out(entry, record, slot.out, slot.target, slot.replace)
    except _Corrupt:
        return False
    slot.hit = record
    return True


@contextmanager
def cache_slot(d: Detection, to: str, out: Path, opts: Options) -> Iterator[Slot]:
    """Look the conversion up: on a hit the artifact is already on ``out`` and ``slot.hit`` is
    set; on a miss the block converts, holding the key's lock when the result may be stored
    (the parity check runs: ``--no-verify`` may use an entry, never fills one). Programs only:
    weights conversions run at disk speed."""
    target = FORMATS_BY_NAME.get(to)
    if not opts.cache or target is None or target.kind != "program":
        yield Slot()
        return
    imports = imported_code(d)
    if imports:
        # the classes the pickle imports are not part of the key: an edited forward would be
        # a stale hit. Neither read nor stored, and the cache directory not even looked at.
        named = ", ".join(imports[:3]) + (", …" if len(imports) > 3 else "")
        yield Slot(
            note=(
                f"not cached: loading the input imports code ({named}) whose source is not "
                "part of the cache key, so a changed class would not be a miss"
                if imports != ["?"]
                else "not cached: what loading the input imports could not be told"
            )
        )
        return
    root = cache_root()
    _prepare(root)
    with progress.step("hashing the input for the cache"):
        key, inputs = _key(d, to, out, opts, imports)
    slot = Slot(root, key, out, target, key_inputs=inputs, replace=opts.force)
    entry = root / "entries" / key
    # readers share the lock (hits copy at once side by side); a filler holds it alone
    with _locked(root, key, fcntl.LOCK_SH):
        found = _hit(slot, entry)
    if found or slot.note or not opts.verify:
        yield slot
        return
    with _locked(root, key, fcntl.LOCK_EX):
        # another process may have filled it while this one waited
        if not _hit(slot, entry) and not slot.note:
            slot.filling = True
        yield slot


# --- cache info / clear ----------------------------------------------------------------------


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
        record = _record(entry)
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
    _prepare(root)
    found: dict[str, list[Path]] = {}
    for folder in ("entries", "tmp"):
        for path in (root / folder).iterdir():
            found.setdefault(path.name.split(".")[0], []).append(path)
    for lock in (root / "locks").glob("*.lock"):
        found.setdefault(lock.name.removesuffix(".lock"), [])
    for key, paths in sorted(found.items()):
        with _locked(root, key, fcntl.LOCK_EX, wait=False) as held:
            if not held:
                result.busy.append(key)
                continue
            for path in paths:
                freed = disk_size(path)
                _remove(path)
                result.freed_bytes += freed
                result.removed += path.parent.name == "entries"
            # under the lock: a process waiting on this file takes the next one (_locked)
            (root / "locks" / f"{key}.lock").unlink(missing_ok=True)
    return result
