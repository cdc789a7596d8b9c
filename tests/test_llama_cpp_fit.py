"""tools/llama_cpp_fit.py's ELF edit on a library of this machine (no wheel needed): each glibc
version newer than the one given is marked weak, nothing else changes, and the loader still
loads the edited copy."""

from __future__ import annotations

import ctypes.util
import shutil
import struct
from pathlib import Path

import pytest

from tools import llama_cpp_fit


def vernaux_flags(path: Path) -> dict[str, int]:
    """Each needed version's name → its vna_flags (what weaken_missing_versions edits)."""
    data = path.read_bytes()
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    flags = {}
    for s in sections:
        if s[1] != llama_cpp_fit.SHT_GNU_VERNEED:
            continue
        strings, entry = sections[s[6]][4], s[4]
        for _ in range(s[7]):
            _, count, _, aux, following = struct.unpack_from("<HHIII", data, entry)
            at = entry + aux
            for _ in range(count):
                _, flag, _, name_at, step = struct.unpack_from("<IHHII", data, at)
                name = data[strings + name_at : data.index(0, strings + name_at)].decode()
                flags[name] = flag
                at += step
            entry += following
    return flags


def test_newer_glibc_versions_are_marked_weak_and_the_copy_still_loads(tmp_path: Path) -> None:

    found = ctypes.util.find_library("stdc++")
    if found is None:
        pytest.skip("no libstdc++ to edit a copy of")
    source = next(
        p / found
        for p in (Path("/lib/x86_64-linux-gnu"), Path("/usr/lib/x86_64-linux-gnu"), Path("/lib64"))
        if (p / found).exists()
    )
    copy = tmp_path / found
    shutil.copy2(source, copy)
    before = vernaux_flags(copy)
    weakened = llama_cpp_fit.weaken_missing_versions(copy, (2, 17))
    after = vernaux_flags(copy)
    newer = {n for n in before if (v := llama_cpp_fit._glibc_tuple(n)) and v > (2, 17)}
    assert newer and set(weakened) == newer
    for name, flag in after.items():
        want = before[name] | (llama_cpp_fit.VER_FLG_WEAK if name in newer else 0)
        assert flag == want, name
    assert llama_cpp_fit.weaken_missing_versions(copy, (2, 17)) == weakened  # again: the same
    assert vernaux_flags(copy) == after
    ctypes.CDLL(str(copy))  # this machine's glibc has them all: weak or not, it loads
