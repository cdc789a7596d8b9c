"""ptconvert: convert PyTorch models between formats, safely, and prove the result right.

The public API (the CLI is a thin layer over it)::

    import ptconvert

    ptconvert.detect("model.bin")     # Detection(path, format="pt", layout="zip")
    ptconvert.describe("model.bin")   # FileInfo: tensors, dtypes, signature, needs_code, …
    ptconvert.scan("model.bin")       # ScanReport: clean / needs-code / dangerous / error
    ptconvert.plan("model.bin", "pt2", model="mypkg.nets:make")
    report = ptconvert.convert("model.bin", "pt2", model="mypkg.nets:make",
                               inputs=["x:2x3x224x224:float32"], dynamic_batch=True)
    report.check                      # "parity": the program ran against the eager model
    ptconvert.verify("model.bin", "model.pt2", model="mypkg.nets:make")
    ptconvert.bench("model.pt2", reference="model.bin", model="mypkg.nets:make")
    ptconvert.optimize("model.bin", model="mypkg.nets:make", inputs=["x:2x8:float32"])
    ptconvert.convert_many("zoo/", "safetensors", "out/", jobs=4)  # BatchReport
    ptconvert.cache_info()            # the cache of verified programs; cache_clear() empties it
    ptconvert.convert("llama/", "pt2", task="text-generation-with-past")  # with its KV cache
    ptconvert.generate("llama.pt2", [[5, 17, 42]], max_new_tokens=16)     # greedy, token by token

Options are keywords (the fields of ``ptconvert.Options``); results are dataclasses with
``to_dict()`` and ``to_json()``; errors are ``ptconvert.errors`` classes, each with its exit
code. Heavy packages (torch, onnx, transformers) are imported only inside the code that needs them.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

# The modules convert/, options, scan/ and verify/ share their names with API functions: they are
# imported first (cheap: their __init__ is empty), then the names are bound to the functions,
# each wrapped so that it still leads into its module: ``ptconvert.verify(...)`` verifies, and
# ``import ptconvert.verify.check as c`` or ``ptconvert.verify.check`` still reach the module.
import ptconvert.convert
import ptconvert.options
import ptconvert.scan
import ptconvert.verify  # noqa: F401
from ptconvert import api as _api
from ptconvert.api import (
    bench,
    cache_clear,
    cache_info,
    convert_every,
    convert_many,
    describe,
    detect,
    format_names,
    generate,
    optimize,
    plan,
)
from ptconvert.deps import VERSION as __version__


class _Entry:
    """An API function that is also the way into the module of the same name."""

    def __init__(self, fn: Any, module: str) -> None:
        functools.update_wrapper(self, fn)
        self._fn, self._module = fn, module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        module = importlib.import_module(self._module)
        if hasattr(module, name):
            return getattr(module, name)
        try:
            return importlib.import_module(f"{self._module}.{name}")
        except ModuleNotFoundError:
            raise AttributeError(name) from None

    def __repr__(self) -> str:
        return f"<function ptconvert.{self._fn.__name__} (and the module {self._module})>"


if TYPE_CHECKING:  # the functions themselves, to a type checker
    from ptconvert.api import convert, options, scan, verify
else:
    convert = _Entry(_api.convert, "ptconvert.convert")
    options = _Entry(_api.options, "ptconvert.options")
    scan = _Entry(_api.scan, "ptconvert.scan")
    verify = _Entry(_api.verify, "ptconvert.verify")

if TYPE_CHECKING:
    from ptconvert.errors import (
        InputError,
        MissingRequirementError,
        ModelRaisedError,
        NeedsTrustError,
        PtconvertError,
        RuntimeDiedError,
        UnsafeInputError,
        UnsupportedConversionError,
        UsageError,
        VerificationError,
    )
    from ptconvert.formats import Detection, FileInfo
    from ptconvert.options import Options

_ERRORS = (
    "InputError",
    "MissingRequirementError",
    "ModelRaisedError",
    "NeedsTrustError",
    "PtconvertError",
    "RuntimeDiedError",
    "UnsafeInputError",
    "UnsupportedConversionError",
    "UsageError",
    "VerificationError",
)
__all__ = [
    "Detection",
    "FileInfo",
    "InputError",
    "MissingRequirementError",
    "ModelRaisedError",
    "NeedsTrustError",
    "Options",
    "PtconvertError",
    "RuntimeDiedError",
    "UnsafeInputError",
    "UnsupportedConversionError",
    "UsageError",
    "VerificationError",
    "__version__",
    "bench",
    "cache_clear",
    "cache_info",
    "convert",
    "convert_every",
    "convert_many",
    "describe",
    "detect",
    "format_names",
    "generate",
    "optimize",
    "options",
    "plan",
    "scan",
    "verify",
]


def __getattr__(name: str) -> Any:
    if name in ("Detection", "FileInfo"):
        from ptconvert import formats as _formats

        return getattr(_formats, name)
    if name == "Options":
        from ptconvert.options import Options

        return Options
    if name in _ERRORS:
        from ptconvert import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'ptconvert' has no attribute {name!r}")
