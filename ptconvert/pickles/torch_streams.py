"""The pickles a loader runs in a stream that is not a zip or a tar: ``torch.load``'s legacy
layout (five pickles, then raw storage bytes), or pickles one after another as ``pickle.load``
in a loop reads them.

Torch's framing of the streams, apart from the machine (``machine.py``) that runs each pickle.
"""

from __future__ import annotations

import mmap

from ptconvert.pickles.machine import run_pickle
from ptconvert.pickles.records import Call, Global, PickleRun, Unknown

# torch.save before 1.6 writes five pickles (this magic number, protocol, sys_info, the object,
# the storage keys), then raw storage bytes that must not be read as opcodes.
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PICKLES = 5


def acted(run: PickleRun) -> bool:
    """Whether the run reached an opcode that imports, calls, builds or cannot be resolved.

    An unpickler that fails before any of these has run nothing: such bytes are not a pickle.
    """
    return any(e.kind in ("import", "call", "build", "unknown") for e in run.events)


def run_torch_pickles(
    data: bytes | mmap.mmap, start: int = 0, *, fresh: bool = False
) -> list[PickleRun]:
    """Every pickle an unpickler would run in a stream that is not a zip or a tar.

    ``torch.load`` runs the first pickle whatever its framing; when that pickle is the legacy
    magic number (or a value only a call can tell) it runs four more, then reads raw storages.
    Otherwise the stream is read as ``pickle.load`` in a loop would: the following pickles up to
    bytes that fail before doing anything. ``fresh`` is ``run_pickle``'s.
    """
    first = run_pickle(data, start, fresh=fresh)
    runs = [first]
    if first.error:
        return runs
    legacy = first.root == LEGACY_MAGIC or isinstance(first.root, (Call, Unknown, Global))
    pos = first.end
    while pos < len(data) and (not legacy or len(runs) < LEGACY_PICKLES):
        run = run_pickle(data, pos, fresh=fresh)
        if run.error and not legacy and not acted(run):
            break  # not a pickle: a loader stops here without having run anything
        runs.append(run)
        if run.error or run.end <= pos:
            break
        pos = run.end
    return runs
