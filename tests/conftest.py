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


def swap_step(monkeypatch: pytest.MonkeyPatch, name: str, make: Any) -> None:
    """The converter named ``name`` replaced by ``make(the converter)`` for one test: a step
    between the stages (``convert.steps``), or a target package's edge."""
    import dataclasses

    from ptconvert.convert import steps
    from ptconvert.formats import FORMATS

    if callable(getattr(steps, name, None)):  # the stages' edges look their step up each plan
        monkeypatch.setattr(steps, name, make(getattr(steps, name)))
        return
    import importlib

    found = False
    for f in FORMATS:
        edges = f.edges()
        if any(e.step == name for e in edges):
            swapped = [
                dataclasses.replace(e, run=make(e.run)) if e.step == name else e for e in edges
            ]
            package = importlib.import_module(f"{type(f).__module__}.edges")
            monkeypatch.setattr(package, "EDGES", swapped)
            found = True
    assert found, f"no converter named {name!r}"
