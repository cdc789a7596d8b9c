"""The global names of TorchScript code as the TorchScript importer resolves them: ``torch.X``
and ``torch.autograd.X`` are ``aten::X``, ``ops.NS.X`` is ``NS::X``, ``__torch__.*`` is code of
the archive itself or a torchbind class under ``__torch__.torch.classes``, ``CONSTANTS.cN`` the
archive's constants, and the builtins and type names the compiler knows without an import.

Each name is judged against the operator policy (``code_policy.py``); the walker of the code
(``tscode.py``) finds the names, this says whether the one each resolves to is allowed.
"""

from __future__ import annotations

import re

from ptconvert.scan.code_policy import denied_op, name_set, op_problem

# The names the TorchScript compiler and importer resolve without any import.
BUILTINS = name_set(
    "print tuple float int bool str complex getattr hasattr isinstance _to_tensor len hex oct round"
    " hash id min max abs all any divmod sum list dict ord chr bin pow range zip enumerate"
    " rangelist sorted AssertionError annotate unchecked_cast uninitialized inf nan"
)
# fork/awaitable run a closure defined in the same function (judged like the rest of it).
_TASKS = frozenset({"fork", "awaitable"})
# Type names: harmless in annotations and in annotate()/unchecked_cast()/isinstance().
_TYPES = name_set(
    "Tensor int float bool complex str Device Stream number None NoneType Any Capsule list tuple"
    " dict List Dict Tuple Optional Union Final Future Await RRef Generator Storage ScalarType"
    " Layout MemoryFormat QScheme Scalar AnyEnumType AnyClassType Quantizer"
)
# torchbind classes real archives name (``__torch__.torch.classes.<ns>.<class>``); any other
# class is native code from a library the loader must already have (or be tricked into) loading.
_KNOWN_CLASSES = frozenset(
    {
        ("quantized", "LinearPackedParamsBase"),
        ("quantized", "Conv2dPackedParamsBase"),
        ("quantized", "Conv3dPackedParamsBase"),
        ("quantized", "EmbeddingPackedParamsBase"),
        ("rnn", "CellParamsBase"),
        ("profiler", "_RecordFunction"),
    }
)
# ``torch.<sub>.<op>``: the printer never writes these, but the brief's spellings resolve to aten.
_TORCH_SUBMODULES = name_set(
    "nn functional _C _nn _fft _linalg _special _VariableFunctions fft linalg special"
)
_CONSTANT = re.compile(r"^c\d+$")


def global_problem(root: str, attrs: list[str]) -> str | None:
    """Why a chain rooted at a global name is refused (None: allowed)."""
    if root == "torch":
        return _torch_problem(attrs)
    if root == "ops":
        return _ops_problem(attrs, "ops")
    if root == "CONSTANTS":
        if len(attrs) == 1 and _CONSTANT.match(attrs[0]):
            return None
        return "CONSTANTS is only ever indexed as CONSTANTS.c<N>"
    if root == "__torch__":
        if attrs[:2] == ["torch", "classes"]:
            return _class_problem(attrs[2:])
        return None if attrs else "bare __torch__ namespace"
    if root in BUILTINS or root in _TYPES or root in _TASKS:
        return f"attribute of builtin {root!r}" if attrs else None
    return f"unknown global name {root!r}"


def _torch_problem(attrs: list[str]) -> str | None:
    """``torch.X`` is ``aten::X``; ``torch.autograd`` is torch again; ``torch.ops``/``.classes``."""
    while attrs and attrs[0] == "autograd":
        attrs = attrs[1:]
    if not attrs:
        return "torch namespace used as a value (aliases defeat name checks)"
    if attrs[0] == "ops":
        return _ops_problem(attrs[1:], "torch.ops")
    if attrs[0] == "classes":
        return _class_problem(attrs[1:])
    if len(attrs) == 1:
        return op_problem("aten", attrs[0])
    *path, leaf = attrs
    if not set(path) <= _TORCH_SUBMODULES:
        return f"unknown torch namespace {'.'.join(path)!r}"
    problem = op_problem("aten", leaf)
    if problem is None or denied_op(leaf):
        return problem
    # torch.fft.fft / torch.linalg.norm / torch.special.erf are aten::fft_fft, linalg_norm, ...
    return None if op_problem("aten", f"{path[-1].lstrip('_')}_{leaf}") is None else problem


def _ops_problem(attrs: list[str], spelled: str) -> str | None:
    if len(attrs) < 2:
        return f"{spelled} namespace used as a value (aliases defeat name checks)"
    if len(attrs) > 2:
        return f"{spelled}.{'.'.join(attrs)} is not an operator"
    return op_problem(attrs[0], attrs[1])


def _class_problem(attrs: list[str]) -> str | None:
    if len(attrs) >= 2 and (attrs[0], attrs[1]) in _KNOWN_CLASSES:
        return None
    return (
        f"torchbind class {'.'.join(attrs) or '(none)'!r} is not one of the known quantized/"
        "profiler classes: its methods are native code from the library that registered it"
    )
