"""Every touch of a private torch or transformers API, declared in one place: each hook names
what it patches, calls or reads, the versions it was tested on, a cheap probe and its fallback
(or the ``CompatError`` it raises). The registry and ``patched`` are in ``registry.py``; the
hooks in ``pt2_archive``, ``onnx_registry``, ``inductor``, ``torch_api`` and ``hf``.
``python -m ptconvert._compat`` prints each hook's status."""

from __future__ import annotations

from ptconvert._compat import hf, inductor, onnx_registry, pt2_archive, torch_api
from ptconvert._compat.registry import HOOKS, Hook, available, options, patched, probe, status

__all__ = [
    "HOOKS",
    "Hook",
    "available",
    "hf",
    "inductor",
    "onnx_registry",
    "options",
    "patched",
    "probe",
    "pt2_archive",
    "status",
    "torch_api",
]
