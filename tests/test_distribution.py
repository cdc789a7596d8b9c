"""The distribution's name: "ptconvert" on the package index is an unrelated project (a GPL
security tool), so `pip install ptconvert` or `pip install 'ptconvert[onnx]'` would install it —
a dependency-confusion trap in a security tool. This project is ``deps.DISTRIBUTION``; its
command and import package stay ``ptconvert``; no text of it tells a user to install the other."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import ptconvert
from ptconvert import deps

ROOT = Path(__file__).resolve().parent.parent
# `pip install ptconvert`, `pip install 'ptconvert[onnx]'`, `pip install "ptconvert>=0.1"` …
OTHER_PROJECT = re.compile(r"pip install\s+['\"]?ptconvert(?![\w-])")


def test_the_distribution_is_not_the_index_s_other_ptconvert() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == deps.DISTRIBUTION != "ptconvert"
    assert project["version"] == deps.VERSION == ptconvert.__version__
    assert project["scripts"] == {"ptconvert": "ptconvert.cli:entry"}
    # the extras' own reference names this distribution
    assert all(
        r.startswith(f"{deps.DISTRIBUTION}[") for r in project["optional-dependencies"]["all"]
    )


def test_no_text_tells_a_user_to_install_the_other_project() -> None:
    texts = [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("ptconvert/**/*.py")]
    said = {str(p.relative_to(ROOT)): OTHER_PROJECT.findall(p.read_text()) for p in texts}
    assert {p: found for p, found in said.items() if found} == {}
    assert "pip install -e '.[onnx]'" in deps.extra_hint("onnx")


def test_the_version_is_the_package_s_own() -> None:
    """``--version`` and the cache's key read ptconvert's own version, never the installed
    metadata of a distribution named "ptconvert" (the other project, if installed)."""
    done = subprocess.run(
        [sys.executable, "-m", "ptconvert", "--version"], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == f"ptconvert, version {ptconvert.__version__}"
