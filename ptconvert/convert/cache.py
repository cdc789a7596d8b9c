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

This module is the policy — when an entry is used, filled or left (``cache_slot``, the
engine's one hook); ``cache_key.py`` makes the key, ``cache_store.py`` keeps the entries.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ptconvert import progress
from ptconvert.convert.cache_key import SCHEMA, imported_code, key_of
from ptconvert.convert.cache_store import (
    Corrupt,
    cache_root,
    copy_checked,
    copy_out,
    foreign,
    locked,
    prepare,
    read_record,
    remove,
)
from ptconvert.convert.conversion_report import ConversionReport
from ptconvert.formats import FORMATS_BY_NAME, Detection
from ptconvert.options import Options

if TYPE_CHECKING:
    from ptconvert.formats.base import Format


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
        files = {p.name: copy_checked(p, tmp / "files" / p.name) for p in written}
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
        whose = foreign(entry)  # found before the fill began; here too, to be sure
        if whose:
            raise OSError(f"{whose}: left as it is")
        # (tmp is mkdtemp's, mode 0700: no other user can reach a file of the entry)
        # incomplete or corrupt (a whole one was a hit), and the folders of fills that died:
        # this process holds the key's lock, no other is filling it
        for stale in [entry, *(slot.root / "tmp").glob(f"{slot.key}.*")]:
            if stale != tmp and stale.exists():
                remove(stale)
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
    whose = foreign(entry)
    if whose:
        slot.note = (
            f"not from the cache, nor stored in it: {whose}; an entry another user made (or "
            "could change) is neither used nor replaced (remove it, or set PTCONVERT_CACHE "
            "to a directory of your own)"
        )
        return False
    record = read_record(entry)
    if record is None:
        return False
    assert slot.out is not None and slot.target is not None
    try:
        _report(record, entry, slot.out, 0.0, slot.key)  # a report that no longer reads
    except (KeyError, TypeError, ValueError):
        return False
    try:
        copy_out(entry, record, slot.out, slot.target, slot.replace)
    except Corrupt:
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
    prepare(root)
    with progress.step("hashing the input for the cache"):
        key, inputs = key_of(d, to, out, opts, imports)
    slot = Slot(root, key, out, target, key_inputs=inputs, replace=opts.force)
    entry = root / "entries" / key
    # readers share the lock (hits copy at once side by side); a filler holds it alone
    with locked(root, key, fcntl.LOCK_SH):
        found = _hit(slot, entry)
    if found or slot.note or not opts.verify:
        yield slot
        return
    with locked(root, key, fcntl.LOCK_EX):
        # another process may have filled it while this one waited
        if not _hit(slot, entry) and not slot.note:
            slot.filling = True
        yield slot
