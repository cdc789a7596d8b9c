from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fixtures.build import build_all
from ptconvert.cli import main


@pytest.fixture(scope="session")
def samples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every fixture format, built once per test session."""
    return build_all(tmp_path_factory.mktemp("fixtures"))


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any, str]:
    """Run the CLI in-process with --json; return (exit code, parsed stdout, stderr)."""
    code = main([*args, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else None, err
