"""The cache's key: what makes two conversions the same — the input's bytes (and every file
loading it reads), the model's source, the options that change the artifact, the versions,
plugins, Inductor settings, CPU and GPU that do."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.machinery
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ptconvert.deps import PLUGIN_GROUP
from ptconvert.errors import PtconvertError
from ptconvert.formats import FORMATS_BY_NAME, Detection
from ptconvert.options import Options

if TYPE_CHECKING:
    pass


CHUNK = 1 << 20  # bytes hashed (and copied) at a time

SCHEMA = 2  # of complete.json and of the key: a change makes every older entry a miss

# Options that do not change the artifact's bytes, each with why. Every other field is in the
# key, so an option added later is keyed by default (a stale hit is worse than a miss).
NOT_IN_KEY: dict[str, str] = {
    "force": "replacing an existing output changes where the artifact goes, not what it is",
    "force_memory": "the memory estimate decides whether to start, not what is written",
    "verify": "an entry is stored only verified; a --no-verify run may use one",
    "cache": "whether to use the cache at all",
    "load_timeout": "how long a load may take before it is stopped, not what is loaded",
    "target_options": "a target's own options are keyed by their target only (key_of)",
    # the key hashes the files of the snapshot they chose (the source the key is of)
    "revision": "which snapshot a Hub id names: the key hashes that snapshot's files",
    "cache_dir": "where a Hub id's snapshot is: the key hashes that snapshot's files",
}

# Packages whose version changes what a conversion writes (when installed): these, and the
# packages every registered format declares it imports (``keyed_packages``).
KEYED_PACKAGES = ("ptconvert", "torch", "transformers", "torchao")  # torchao: --quantize


def keyed_packages() -> tuple[str, ...]:
    from ptconvert.formats import FORMATS

    declared = (p for f in FORMATS for p in f.packages)
    return tuple(dict.fromkeys([*KEYED_PACKAGES, *declared]))


# Environment variables that change what torch.compile / Inductor / export produce: every one
# set with these prefixes is in the key, by name and value.
KEYED_ENVIRONMENT = ("TORCHINDUCTOR_", "TORCH_COMPILE_")

NOT_KEYED_ENVIRONMENT = {
    # where compiled kernels are kept, not what they are; and torch sets it in os.environ at
    # its first compile, which would make a process's later conversions other keys
    "TORCHINDUCTOR_CACHE_DIR": "torch sets it itself",
}


def _hash_file(path: Path, h: Any) -> int:
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size


# a file's digest per process, by its identity and stat: the batch manifest's key, the cache's
# lookup and each target of ``--to all`` read one source's bytes once, not once each
_DIGESTS: dict[tuple[str, int, int, int], tuple[bytes, int]] = {}


def _file_digest(path: Path) -> tuple[bytes, int]:
    """The file's sha256 and size (hashed again only when its size, mtime or inode changed)."""
    st = path.stat()
    identity = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    if identity not in _DIGESTS:
        h = hashlib.sha256()
        size = _hash_file(path, h)
        _DIGESTS[identity] = (h.digest(), size)
    return _DIGESTS[identity]


def _content(path: Path) -> str | None:
    try:
        return _file_digest(path)[0].hex()
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

    from ptconvert.deps import VERSION  # its distribution is named otherwise (DISTRIBUTION)

    found: dict[str, str | None] = {"python": "{}.{}".format(*sys.version_info[:2])}
    for name in keyed_packages():
        try:
            found[name] = version(name) if name != "ptconvert" else VERSION
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
    option but ``NOT_IN_KEY``, the versions of ``keyed_packages()`` and of the installed plugins,
    the ``KEYED_ENVIRONMENT`` variables, the CPU (native code) or GPU (``--device cuda``).

    Not covered, so a changed output with the same key: what a ``pkg.module:factory`` module
    imports, and the source of the classes loading the input imports, listed in the document's
    ``imports_code`` (a whole pickled module, ``--trust``). When ``imports_code`` is non-empty
    the key does not determine the output: the cache does not keep such a conversion, and a
    caller should not treat an equal key as an equal output either."""
    return key_of(d, to, out, opts, imported_code(d))


def key_of(
    d: Detection, to: str, out: Path, opts: Options, imports: list[str]
) -> tuple[str, dict[str, Any]]:
    target = FORMATS_BY_NAME[to]
    source = hashlib.sha256()
    total = 0
    files = _source_files(d)
    for name, path in files:
        source.update(f"{len(name)}:{name}:".encode())
        digest, size = _file_digest(path)
        total += size
        source.update(digest)
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
        "target_options": (
            dataclasses.asdict(opts.of(target.options_class)) if target.options_class else {}
        ),
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
