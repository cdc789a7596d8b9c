"""Fault injection: the machine fails (no space, another filesystem, read-only, a kill -9) or the
input is subtly wrong; each case ends in a named error with its exit code, or succeeds, and
leaves nothing behind.

A real tmpfs is mounted where this process may (root, as in CI containers); elsewhere those
tests are skipped and the injected twins (a monkeypatched ``os`` call) still run."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
PTCONVERT = [sys.executable, "-m", "ptconvert"]


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """``mount(name, size="1m", ro=False)``: a tmpfs of its own at ``tmp_path / name`` (so on
    another filesystem than ``tmp_path``), unmounted after the test; skips where mounting is
    not allowed."""
    mounted: list[Path] = []

    def make(name: str, size: str = "1m", ro: bool = False) -> Path:
        where = tmp_path / name
        where.mkdir()
        options = f"size={size}" + (",ro" if ro else "")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True
        )
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(where)
        return where

    yield make
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def checkpoint(path: Path, megabytes: float = 0.01, seed: int = 0) -> Path:
    """A torch zip state dict of about ``megabytes`` (one big tensor and a small one)."""
    torch.manual_seed(seed)
    n = max(4, int(megabytes * 2**20) // 4)
    torch.save({"big": torch.randn(n), "small": torch.randn(3, 4)}, path)
    return path


def temporaries(folder: Path) -> list[Path]:
    """What a run leaves beside its outputs besides them: hidden names (temporary folders)."""
    return sorted(p for p in folder.rglob(".*") if p.name != ".ptconvert-batch.json")


def cli(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """The CLI in a process of its own (``--json`` output on stdout)."""
    return subprocess.Popen(
        [*PTCONVERT, *args, "--json"],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
