"""Models named by a Hugging Face Hub id (``owner/name``, ``hf://owner/name``, either with
``@revision``) resolved to a snapshot folder of huggingface_hub's cache, as optimum-cli and
transformers' ``from_pretrained`` find them (docs/hub.md).

The rules, in order:

1. a path that exists here always wins: ``acme/tiny-gpt2`` is that folder when there is one
   (so is ``dir/model.bin`` when ``dir`` exists or the name ends in a model file's suffix:
   a missing file, not an id; ``hf://`` says it is an id);
2. an id is looked up in the cache (``--cache-dir``, else ``HF_HUB_CACHE``, else
   ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``) with no network at all;
3. only when the cache lacks it and the network is allowed (``HF_HUB_OFFLINE`` unset) is the
   snapshot downloaded into that cache, as optimum-cli does;
4. otherwise a ``HubModelNotFoundError`` (exit 3, a missing input) names the id, the revision
   and the cache folder searched, with the ways out.

huggingface_hub is imported only when an id is resolved.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ptconvert.errors import HubModelNotFoundError, UsageError

# huggingface_hub's own rule for a name: letters, digits, -, _ and ., not starting or ending
# with - or .; ``hf://`` may name a model without an owner (``hf://gpt2``); a revision after @
_NAME = r"[A-Za-z0-9_](?:[\w.-]*[A-Za-z0-9_])?"
_ID = re.compile(rf"^(?P<repo>{_NAME}/{_NAME})(?:@(?P<rev>[^\s@]+))?$")
_HF_ID = re.compile(rf"^(?P<repo>(?:{_NAME}/)?{_NAME})(?:@(?P<rev>[^\s@]+))?$")
# a name ending so names a model file: ``dir/model.bin`` missing is a path, never looked up
_FILE_SUFFIXES = (".bin", ".pt", ".pth", ".pt2", ".safetensors", ".onnx", ".pte", ".gguf", ".ckpt")
_TRUE = {"1", "on", "yes", "true"}  # huggingface_hub's truthy environment values


@dataclass(frozen=True)
class HubModel:
    """An id resolved: the repository, the revision asked for, the snapshot folder it names."""

    repo_id: str
    revision: str
    snapshot: Path
    cache_dir: Path

    @property
    def note(self) -> str:
        """What every report says of the source."""
        return f"{self.repo_id} at revision {self.revision}: the Hub cache's {self.snapshot}"


def parse_id(text: str) -> tuple[str, str | None] | None:
    """``owner/name[@rev]`` or ``hf://[owner/]name[@rev]`` → (repo id, revision); None for
    anything else."""
    if text.startswith("hf://"):
        m = _HF_ID.match(text.removeprefix("hf://").rstrip("/"))
    else:
        m = _ID.match(text)
    return (m["repo"], m["rev"]) if m else None


def cache_folder(cache_dir: str | Path | None = None) -> Path:
    """The hub cache searched: ``cache_dir``, else huggingface_hub's environment variables read
    now (its constants are read once, when it is imported)."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    env = os.environ
    hub = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if hub:
        return Path(hub).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home, "hub").expanduser()


def offline() -> bool:
    """Whether the user forbids the network (``HF_HUB_OFFLINE``, as huggingface_hub reads it)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def resolve(
    src: str | Path, revision: str | None = None, cache_dir: str | Path | None = None
) -> HubModel | None:
    """The snapshot the id ``src`` names; None when ``src`` is a local path (one that exists,
    or one whose folder does) or not an id at all (the command says it is missing)."""
    text = str(src)
    if Path(text).exists():
        return None
    parsed = parse_id(text)
    if parsed is None:
        return None
    repo_id, at = parsed
    if not text.startswith("hf://") and (
        Path(repo_id.split("/")[0]).is_dir() or repo_id.lower().endswith(_FILE_SUFFIXES)
    ):
        return None  # a path, missing: the command says so as it says it of any file
    if at and revision and at != revision:
        raise UsageError(f"{text} names revision {at!r} and --revision says {revision!r}")
    revision = at or revision or "main"
    cache = cache_folder(cache_dir)
    snapshot = _from_cache(repo_id, revision, cache)
    if snapshot is None and not offline():
        snapshot = _download(repo_id, revision, cache, text)
    if snapshot is None:
        raise _not_found(text, repo_id, revision, cache)
    return HubModel(repo_id, revision, snapshot, cache)


def _from_cache(repo_id: str, revision: str, cache: Path) -> Path | None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(
            repo_id, revision=revision, cache_dir=cache, local_files_only=True
        )
    except LocalEntryNotFoundError:  # a FileNotFoundError: not the caller's path missing
        return None
    return Path(folder)


def _download(repo_id: str, revision: str, cache: Path, text: str) -> Path | None:
    """The snapshot fetched from the Hub into ``cache``; None when the Hub cannot be reached
    (huggingface_hub's own offline fallback found nothing either)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache))
    except LocalEntryNotFoundError:
        return None
    except (HfHubHTTPError, ValueError) as exc:  # no such repository or revision, gated, …
        raise HubModelNotFoundError(
            f"the Hugging Face Hub refused {repo_id} at revision {revision}: {exc}",
            path=text,
            hint="check the id and the revision; a gated or private model needs "
            "`huggingface-cli login`",
        ) from exc


def _not_found(text: str, repo_id: str, revision: str, cache: Path) -> HubModelNotFoundError:
    why = "HF_HUB_OFFLINE is set" if offline() else "the Hub could not be reached"
    return HubModelNotFoundError(
        f"no such file or directory, nor a model {repo_id} at revision {revision} in the "
        f"Hugging Face cache {cache} ({why})",
        path=text,
        hint=f"download it with `huggingface-cli download {repo_id}"
        + (f" --revision {revision}" if revision != "main" else "")
        + "`, or point --cache-dir (HF_HUB_CACHE) at the cache that holds it",
    )


def snapshot_of(path: Path) -> tuple[Path, str] | None:
    """The snapshot folder of the Hub cache that holds ``path`` (or is it) and the name of its
    repository (``models--acme--tiny-gpt2/snapshots/<commit>/…`` → ``tiny-gpt2``), by the
    cache's layout; None outside a cache."""
    path = Path(os.path.abspath(path))
    for folder in (path, *path.parents):
        repo = folder.parent.parent.name
        if folder.parent.name == "snapshots" and repo.startswith(("models--", "datasets--")):
            return folder, repo.split("--")[-1]
    return None


def links_into_blobs(base: Path, target: Path) -> bool:
    """Whether ``target`` (resolved) is a file of the blobs folder of the cached repository
    whose snapshot holds ``base``: how huggingface_hub lays a snapshot out (each file a link
    to its blob), so within the model's own files."""
    found = snapshot_of(base)
    if found is None:
        return False
    blobs = (found[0].parent.parent / "blobs").resolve()
    return target.parent == blobs
