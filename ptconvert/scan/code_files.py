"""Files that are code, not data: Python source, and the Hugging Face configs that name it.

Python source runs when it is imported: ``transformers`` imports a model folder's own ``.py``
files under ``trust_remote_code`` when a config's ``auto_map`` names their classes. Such a file
is reported as code (``needs-code``: it is code the user must trust, and nothing in it is judged
safe or unsafe), never opened as a pickle. A config whose ``auto_map`` names classes is
``needs-code`` too, naming them and the files that hold them.
"""

from __future__ import annotations

import json
from pathlib import Path

from ptconvert.scan.analysis import Finding

MAX_CONFIG = 16 << 20  # bytes of a config read for its auto_map
SOURCE = "Python source: it runs when imported (a model folder's code, under trust_remote_code)"


def is_source(path: Path) -> bool:
    return path.suffix == ".py"


def source_findings(path: Path) -> list[Finding]:
    return [Finding("needs-code", str(path), 0, "-", None, SOURCE)]


def auto_map_findings(path: Path) -> list[Finding]:
    """One finding per class that an ``auto_map`` in this config names (config.json,
    tokenizer_config.json, preprocessor_config.json …); none for any other file."""
    config = _config(path)
    if config is None:
        return []
    from ptconvert.formats.hf import remote_code

    out = []
    for ref in remote_code(config):
        repo, _, dotted = ref.rpartition("--")  # "repo--module.Class": another repository's
        module = dotted.rpartition(".")[0] or dotted
        if repo:
            where = f"downloaded from the repository {repo!r}"
        elif (path.parent / f"{module}.py").is_file():
            where = "in this folder"
        else:
            where = "not in this folder: downloaded from the model's repository"
        why = f"auto_map names {dotted}: trust_remote_code imports (runs) {module}.py, {where}"
        out.append(Finding("needs-code", str(path), 0, "auto_map", dotted, why))
    return out


def _config(path: Path) -> dict[str, object] | None:
    if not path.name.endswith("config.json"):
        return None
    try:
        if path.stat().st_size > MAX_CONFIG:
            return None
        config = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None  # not JSON: scanned as the bytes it is
    return config if isinstance(config, dict) else None
