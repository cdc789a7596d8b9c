"""Lazy imports of optional packages with a one-line error naming the extra to install, and the
torch release a feature needs when it is newer than the floor (``require_torch``)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType
from typing import Any

from ptconvert.errors import MissingRequirementError

# The entry-point group plugins register under (plugins.py loads it; the cache keys its members).
PLUGIN_GROUP = "ptconvert.plugins"

# Which extra of ptconvert brings each optional top-level package: these, and the packages each
# registered format declares (``declare_extra``, called by the format registry).
EXTRAS: dict[str, str] = {
    "transformers": "hf",
    "matplotlib": "plot",
    "ray": "ray",
    "torchao": "quantize",
}


def declare_extra(packages: tuple[str, ...], extra: str) -> None:
    """``packages`` come with ptconvert's extra ``extra`` (a format declares what it imports)."""
    for package in packages:
        EXTRAS.setdefault(package, extra)


def require(module: str, instead: str = "") -> ModuleType:
    """Import ``module`` or raise MissingRequirementError naming the extra that provides it (and
    ``instead``: what else the user can do)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        hint = _install_hint(top)
        raise MissingRequirementError(
            f"this needs the optional package {top!r}, which is not installed ({exc})",
            hint=f"{hint}, or {instead}" if instead else hint,
        ) from exc


def require_installed(module: str) -> None:
    """Raise as ``require`` does when ``module`` is not installed, without importing it (for a
    package that another process imports)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        top = module.split(".")[0]
        raise MissingRequirementError(
            f"this needs the optional package {top!r}, which is not installed",
            hint=_install_hint(top),
        )


# torch dtypes newer than the floor pyproject.toml declares (torch>=2.13): the release that added
# each. A file written by a newer torch names them; ptconvert copies their bytes without torch, but
# whatever hands them to torch (verification, tensors rebuilt in memory) needs that release.
TORCH_DTYPES_SINCE: dict[str, str] = {"bcomplex32": "2.14"}


def require_torch(
    min_version: str, feature: str, *, path: str | Path | None = None, instead: str | None = None
) -> None:
    """Raise MissingRequirementError naming ``feature``, the installed torch and the version it
    needs when the installed torch is older than ``min_version`` (a release such as "2.14";
    nightlies and local builds of that release count as it). ``instead``: what else the user
    can do, added to the install hint."""
    import torch

    installed = str(torch.__version__)
    if _release(installed) < _release(min_version):
        hint = f"pip install 'torch>={min_version}'"
        raise MissingRequirementError(
            f"{feature} needs torch>={min_version}; torch {installed} is installed",
            path=path,
            hint=f"{hint}, or {instead}" if instead else hint,
        )


def torch_dtype(
    name: str, feature: str, *, path: str | Path | None = None, instead: str | None = None
) -> Any:
    """``torch.<name>`` for a dtype name as ptconvert records it (``bcomplex32``); one the
    installed torch is too old for is a MissingRequirementError as ``require_torch`` raises."""
    import torch

    since = TORCH_DTYPES_SINCE.get(name)
    if since is not None:
        require_torch(
            since, f"{feature} ({name} is new in torch {since})", path=path, instead=instead
        )
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        hint = "pip install --upgrade torch"
        raise MissingRequirementError(
            f"{feature} needs the dtype {name}, which torch {torch.__version__} does not have",
            path=path,
            hint=f"{hint}, or {instead}" if instead else hint,
        )
    return dtype


def _release(version: str) -> tuple[int, ...]:
    """(2, 14) of "2.14", "2.14.1+cu130" or "2.14.0a0+git1234"; trailing zeros dropped."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    parts = [int(p) for p in match.group(0).split(".")] if match else []
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def _install_hint(top: str) -> str:
    extra = EXTRAS.get(top)
    return extra_hint(extra) if extra else f"pip install {top}"


# ptconvert's distribution name: "ptconvert" on the package index is an unrelated project, so a
# hint must never name that distribution (pip would install that one). Until this one is
# published, an extra is installed from the source checkout.
DISTRIBUTION = "torch-ptconvert"
VERSION = "0.1.0"  # ptconvert.__version__ (pyproject's): read here, never from the metadata


def extra_hint(extra: str) -> str:
    """How to install ptconvert's ``extra`` (its optional packages)."""
    return f"pip install -e '.[{extra}]' in ptconvert's checkout (the {DISTRIBUTION} {extra} extra)"
