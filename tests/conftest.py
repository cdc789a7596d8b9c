from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from fixtures.build import build_all
from ptconvert.cli import main


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test` runs two workers) each worker computes on one thread:
    torch's default of one thread per core, in every worker, would oversubscribe the cores; and
    compiles into an Inductor cache of its own (two workers compiling the same model into one
    cache at once read each other's half-written files: a package with an empty metadata file)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        import tempfile

        cache = Path(tempfile.gettempdir()) / f"ptconvert-tests-inductor-{worker}"
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache))
        import torch

        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own empty cache of converted programs (subprocesses inherit the variable):
    never the user's, and no test served an artifact another test made."""
    root = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("PTCONVERT_CACHE", str(root))
    return root


@pytest.fixture(scope="session")
def samples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every fixture format, built once per test session."""
    return build_all(tmp_path_factory.mktemp("fixtures"))


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any, str]:
    """Run the CLI in-process with --json; return (exit code, parsed stdout, stderr)."""
    code = main([*args, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else None, err
