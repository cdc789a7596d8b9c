"""Lazy imports of optional packages with a one-line error naming the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from ptconvert.errors import MissingRequirementError

# Which extra of ptconvert brings each optional top-level package.
EXTRAS: dict[str, str] = {
    "onnx": "onnx",
    "onnxruntime": "onnx",
    "onnxscript": "onnx",
    "transformers": "hf",
    "matplotlib": "plot",
}


def require(module: str) -> ModuleType:
    """Import ``module`` or raise MissingRequirementError naming the extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        raise MissingRequirementError(
            f"this needs the optional package {top!r}, which is not installed ({exc})",
            hint=_install_hint(top),
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


def _install_hint(top: str) -> str:
    extra = EXTRAS.get(top)
    return f"pip install 'ptconvert[{extra}]'" if extra else f"pip install {top}"
