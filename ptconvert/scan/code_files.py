"""Files that are code, not data: the Python source a loader imports, and the Hugging Face
configs that name it.

Python source runs when it is imported: ``transformers`` imports a model folder's own ``.py``
files under ``trust_remote_code`` when a config's ``auto_map`` (or ``custom_pipelines``) names
their classes, and with them every file those import relatively (``from .x import``, followed
as transformers follows them). Such a file is reported as code (``needs-code``: code the user
must trust, nothing in it judged safe or unsafe), never opened as a pickle. A ``.py`` file that
nothing names is imported by no loader: it is scanned as the bytes it is, like any other file.
A config whose ``auto_map`` names classes is ``needs-code`` too, naming them and their files.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

from ptconvert.scan.analysis import Finding

MAX_CONFIG = 16 << 20  # bytes of a config read for its auto_map, of a source for its imports
SOURCE = "source"  # the opcode column of a loaded source's finding
_READ = (".py", "config.json")  # the files that decide which source is imported
_RELATIVE = re.compile(rb"^\s*(?:import\s+\.(\S+)\s*$|from\s+\.(\S+)\s+import)", re.MULTILINE)


def is_source(path: Path) -> bool:
    return path.suffix == ".py"


def source_findings(path: Path) -> list[Finding]:
    """A ``.py`` file that a loader imports: needs-code, saying who imports it; none for one
    that nothing imports."""
    why = loaded_by(path)
    if why is None:
        return []
    text = f"Python source that runs when trust_remote_code imports it ({why})"
    return [Finding("needs-code", str(path), 0, SOURCE, None, text)]


def loaded_by(path: Path) -> str | None:
    """Why transformers imports this ``.py`` file under trust_remote_code, or None."""
    if not is_source(path):
        return None
    folder = path.parent
    try:
        names = sorted(
            e.name for e in os.scandir(folder) if e.name.endswith((".py", "config.json"))
        )
        state = tuple((n, (s := (folder / n).stat()).st_mtime_ns, s.st_size) for n in names)
    except OSError:
        return None
    return _loaded_modules(str(folder), state).get(path.stem)


@functools.lru_cache(maxsize=64)  # a folder's .py files share its configs: read them once
def _loaded_modules(folder: str, state: tuple[tuple[str, int, int], ...]) -> dict[str, str]:
    """Module name → why it is imported, for a folder whose files are ``state`` (the cache key)."""
    from ptconvert.formats.hf import remote_code

    base = Path(folder)
    loaded: dict[str, str] = {}
    for name, _, _ in state:
        config = _config(base / name)
        for ref in remote_code(config) if config is not None else []:
            repo, _, dotted = ref.rpartition("--")
            if not repo:  # another repository's code is downloaded, not this folder's file
                loaded.setdefault(dotted.rpartition(".")[0] or dotted, f"{name} names {dotted}")
    pending = list(loaded)
    while pending:  # relative imports, followed as transformers' get_relative_import_files
        module = pending.pop()
        for imported in _relative_imports(base / f"{module}.py"):
            if imported not in loaded:
                loaded[imported] = f"{module}.py imports it"
                pending.append(imported)
    return loaded


def _relative_imports(path: Path) -> list[str]:
    try:
        if path.stat().st_size > MAX_CONFIG:
            return []
        text = path.read_bytes()
    except OSError:
        return []
    found = (a or b for a, b in _RELATIVE.findall(text))
    return [m.decode("utf-8", "replace") for m in found]


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
