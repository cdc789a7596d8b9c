"""The batch's manifest (``.ptconvert-batch.json`` in the output folder): per source, what
determined its output (``output_key``), the output's files as written and the check that passed,
so that a re-run skips the outputs already complete and verified. The driver alone writes it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ptconvert.atomic import atomic_path
from ptconvert.errors import PtconvertError
from ptconvert.options import Options

MANIFEST = ".ptconvert-batch.json"


def output_key(src: Path, to: str, out: Path, opts: Options) -> str | None:
    """What determines the output (the cache's key: the bytes of every file the source loads
    from, the model's code, the options, the versions), or None when that cannot say it: a
    file not recognised, a pickle that imports classes of its own."""
    from ptconvert.convert.cache_key import cache_key
    from ptconvert.formats import detect

    try:
        key, covered = cache_key(detect(src), to, out, opts)
    except PtconvertError:
        return None
    # a whole pickled module: the classes it imports are not in the key, so never "complete"
    return None if covered.get("imports_code") else key


def _outputs_stat(out: Path, to: str) -> list[Any]:
    """Names, sizes and mtimes of the output and its companion files (an ONNX model's data)."""
    from ptconvert.formats import FORMATS_BY_NAME

    target = FORMATS_BY_NAME.get(to)
    paths = [out, *(target.companions(out) if target else [])]
    files = [f for p in paths for f in (sorted(p.rglob("*")) if p.is_dir() else [p])]
    return [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files if f.is_file()]


class Manifest:
    """What this output folder's batches wrote: per source, the key of what determined the
    output (``output_key``), the output's files as written, and the check that passed.
    Rewritten whole after each model, by the driver only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}
        try:
            data = json.loads(path.read_text())
            self.entries = dict(data.get("entries", {})) if data.get("version") == 2 else {}
        except (OSError, ValueError, AttributeError):
            pass  # no manifest (or an unreadable one): everything is converted again

    def complete(self, src: str, key: str | None, out: Path, to: str, verify: bool) -> str | None:
        """The check of a complete output of the same source and options, or None."""
        e = self.entries.get(src)
        if key is None or e is None or e["key"] != key or e["output"] != str(out):
            return None
        if not self._untouched(e, out, to):
            return None
        return str(e["check"]) if e["check"] != "none" or not verify else None

    def wrote(self, src: str, out: Path, to: str) -> bool:
        """Whether the file at ``out`` is the one this batch wrote (or nothing is there)."""
        e = self.entries.get(src)
        return (
            e is not None
            and e["output"] == str(out)
            and (not out.exists() or self._untouched(e, out, to))
        )

    def _untouched(self, e: dict[str, Any], out: Path, to: str) -> bool:
        return out.exists() and _outputs_stat(out, to) == e["files"]

    def record(self, src: str, key: str | None, out: Path, to: str, check: str) -> None:
        if key is None:
            return
        self.entries[src] = {
            "key": key,
            "output": str(out),
            "files": _outputs_stat(out, to),
            "check": check,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(self.path, replace=True) as tmp:  # the driver's own file
            tmp.write_text(json.dumps({"version": 2, "entries": self.entries}, indent=1))
