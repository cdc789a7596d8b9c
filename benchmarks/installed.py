"""Run the commands a benchmark times as an installed package runs: with Python's bytecode cache.

`pip install` compiles a package's modules at install time, so a user's `ptconvert` reads
`.pyc` files; an environment with ``PYTHONDONTWRITEBYTECODE`` set (some CI images and sandboxes)
would otherwise compile every module of ptconvert, torch's Python and transformers on each run —
about 0.13 s of ptconvert's own start-up, and more for the libraries. Every benchmark calls
:func:`as_installed` first: the variable is dropped for its subprocesses and ptconvert's
modules are compiled once, as pip does.
"""

from __future__ import annotations

import compileall
import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ptconvert"


def as_installed() -> None:
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    compileall.compile_dir(PACKAGE, quiet=1)
