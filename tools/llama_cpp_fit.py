"""llama.cpp's own prebuilt libraries (the ``llama-cpp-py-sync`` wheel's) made loadable on a
machine whose glibc is older than the one they were linked against.

The wheel (tagged manylinux2014) ships ``libllama.so`` and ``libggml*.so`` built against glibc
2.38: they ask for its C23 entry points (``__isoc23_strtol``, ``__isoc23_sscanf``, …, version
GLIBC_2.38), which Debian 12's glibc 2.36 lacks, so ``dlopen`` refuses them whole. This copies
the libraries to a folder of their own (the installed wheel stays as pip wrote it), marks each
glibc version this machine's libc does not define as a *weak* version reference (ELF
``VER_FLG_WEAK``: the loader then only notes it missing) and compiles ``libisoc23.so``: those
C23 functions as the C99 ones (they differ only in accepting ``0b`` binary literals), which a
client loads ``RTLD_GLOBAL`` before llama.cpp. llama.cpp's code itself is unchanged: the
client runs the wheel's compiled llama.cpp. Where the machine's glibc has every version, the
copies are unchanged and the shim is never used (libc's own definitions come first).

A stamp holding the wheel's libraries' hashes, the glibc version and the shim's source makes a
rerun do nothing; the probe (``ctypes`` loads the shim, then ``libllama.so`` with every symbol
bound now) fails the build with the loader's own message where anything is still missing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

SHIM = "libisoc23.so"
LIBRARY = "libllama.so"
SHIM_SOURCE = r"""
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
long __isoc23_strtol(const char *s, char **e, int b) { return strtol(s, e, b); }
long long __isoc23_strtoll(const char *s, char **e, int b) { return strtoll(s, e, b); }
unsigned long __isoc23_strtoul(const char *s, char **e, int b) { return strtoul(s, e, b); }
unsigned long long __isoc23_strtoull(const char *s, char **e, int b) { return strtoull(s, e, b); }
int __isoc23_vsscanf(const char *s, const char *f, va_list a) { return vsscanf(s, f, a); }
int __isoc23_sscanf(const char *s, const char *f, ...) {
    va_list a;
    va_start(a, f);
    int n = vsscanf(s, f, a);
    va_end(a);
    return n;
}
"""
VER_FLG_WEAK = 0x2
SHT_GNU_VERNEED = 0x6FFFFFFE

# what the client runs before importing the package (tests/clients/llama_cpp_client.py too)
PROBE = """
import ctypes, os, sys
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
ctypes.CDLL(sys.argv[2], mode=os.RTLD_NOW)
"""


def glibc_version() -> tuple[int, int]:
    found = os.confstr("CS_GNU_LIBC_VERSION") or "glibc 0.0"  # "glibc 2.36"
    major, minor = found.split()[1].split(".")[:2]
    return int(major), int(minor)


def _glibc_tuple(name: str) -> tuple[int, ...] | None:
    if not name.startswith("GLIBC_") or name.startswith("GLIBC_PRIVATE"):
        return None
    try:
        return tuple(int(p) for p in name[len("GLIBC_") :].split("."))
    except ValueError:
        return None


def weaken_missing_versions(path: Path, have: tuple[int, int]) -> list[str]:
    """Mark each ``GLIBC_x.y`` newer than ``have`` that ``path`` (a 64-bit little-endian ELF
    shared library) needs as a weak version reference, in place; returns those names."""
    data = bytearray(path.read_bytes())
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    # (name, type, flags, addr, offset, size, link, info, align, entsize)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    weakened = []
    for section in sections:
        if section[1] != SHT_GNU_VERNEED:
            continue
        strings, entry = sections[section[6]][4], section[4]
        for _ in range(section[7]):  # Elf64_Verneed: version, cnt, file, aux, next
            _, count, _, aux, following = struct.unpack_from("<HHIII", data, entry)
            at = entry + aux
            for _ in range(count):  # Elf64_Vernaux: hash, flags, other, name, next
                _, flags, _, name_at, step = struct.unpack_from("<IHHII", data, at)
                end = data.index(0, strings + name_at)
                name = data[strings + name_at : end].decode()
                version = _glibc_tuple(name)
                if version is not None and version > have:
                    struct.pack_into("<H", data, at + 4, flags | VER_FLG_WEAK)
                    weakened.append(name)
                at += step
            entry += following
    if weakened:
        path.write_bytes(data)
    return weakened


def package_dir(python: Path) -> Path:
    """Where the venv's ``llama_cpp_py_sync`` lies (found without loading llama.cpp)."""
    find = "import importlib.util as u; print(u.find_spec('llama_cpp_py_sync').origin)"
    done = subprocess.run([python, "-c", find], check=True, capture_output=True, text=True)
    return Path(done.stdout.strip()).parent


def _libraries(package: Path) -> list[Path]:
    return sorted(p for p in package.iterdir() if p.name.startswith("lib") and ".so" in p.name)


def fit_wanted(python: Path) -> str:
    """What the fitted folder's stamp holds once it is built from ``python``'s wheel here."""
    libraries = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in _libraries(package_dir(python))
    }
    return json.dumps(
        {"libraries": libraries, "glibc": glibc_version(), "shim": SHIM_SOURCE}, sort_keys=True
    )


def fit_ready(python: Path, out: Path) -> bool:
    stamp = out / "stamp.json"
    return stamp.is_file() and stamp.read_text() == fit_wanted(python)


def fit(python: Path, out: Path) -> Path:
    """The folder of llama.cpp's libraries this machine loads (``libllama.so`` and
    ``libisoc23.so`` in it), made or reused; returns it."""
    want = fit_wanted(python)
    stamp = out / "stamp.json"
    if stamp.is_file() and stamp.read_text() == want:
        return out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    have = glibc_version()
    for lib in _libraries(package_dir(python)):
        copy = out / lib.name
        shutil.copy2(lib, copy)
        weakened = weaken_missing_versions(copy, have)
        if weakened:
            names = ", ".join(sorted(set(weakened)))
            print(f"{copy.name}: glibc {names} weak (this machine's is {have[0]}.{have[1]})")
    (out / "isoc23.c").write_text(SHIM_SOURCE)
    subprocess.run(
        ["gcc", "-O2", "-shared", "-fPIC", "-o", out / SHIM, out / "isoc23.c"], check=True
    )
    subprocess.run([python, "-c", PROBE, out / SHIM, out / LIBRARY], check=True)
    stamp.write_text(want)
    return out
