"""ptconvert: convert PyTorch models between formats, safely, and prove the result right.

The public API (the CLI is a thin layer over it)::

    import ptconvert
    ptconvert.detect("model.bin")    # Detection(path, format="pt", layout="zip")
    ptconvert.describe("model.bin")  # FileInfo: tensors, dtypes, signature, needs_code, …

Heavy packages (torch, onnx, transformers) are imported only inside the code that needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from ptconvert.formats import Detection, FileInfo, describe, detect

__all__ = ["Detection", "FileInfo", "__version__", "describe", "detect"]


def __getattr__(name: str) -> Any:
    if name in ("detect", "describe", "Detection", "FileInfo"):
        from ptconvert import formats

        return getattr(formats, name)
    raise AttributeError(f"module 'ptconvert' has no attribute {name!r}")
