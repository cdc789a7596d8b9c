"""The policy code in a model file is judged by: the operators it may call, those refused by
name, and the finding a refused piece of code makes.

Allowlist, fail closed: an operator is allowed only when it is listed for its namespace (every
``aten``/``prim``/``quantized`` operator torch 2.13 or 2.14 registers, plus the profiler's
record_function ops) and is not denied (file, process, network, global RNG/cache state, storage
re-pointing, checks skipped); any other namespace is a custom op from some native library.
TorchScript code (``tscode.py``) and the graphs of a .pt2 (``exported_graph.py``) are both
judged by it: one policy, whichever way a program spells its calls.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ptconvert.report import Verdict
from ptconvert.scan import torch_ops


def name_set(text: str) -> frozenset[str]:
    """A table of names written as one string of words."""
    return frozenset(text.split())


DANGEROUS: Verdict = "dangerous"
ERROR: Verdict = "error"


@dataclass(frozen=True)
class CodeFinding:
    """One problem in one code member: where, which name, and why it is refused."""

    severity: Verdict  # "dangerous" | "error"
    line: int  # 1-based line in the member
    name: str | None  # the call/attribute judged, e.g. "torch.from_file", "ops.myns.op"
    reason: str


# Operators refused even though torch registers them: every spelling of them, in any namespace,
# and as a method or attribute name of any value (``x.save(...)``, ``getattr(x, "save")``).
_DENIED: dict[str, str] = {
    "from_file": "maps a file into a tensor and creates it when shared=True",
    "save": "writes a file",
    "load": "reads a file",
    "_load_for_lite_interpreter": "reads and runs another model file",
    "_load_for_mobile": "reads and runs another model file",
    "load_tensor": "reads a tensor from a named file",
    "manual_seed": "changes the global random state",
    "seed": "changes the global random state",
    "_cufft_set_plan_cache_max_size": "changes process-wide CUDA state",
    "_cufft_clear_plan_cache": "changes process-wide CUDA state",
    "set_": "re-points a tensor at another storage",
    "set": "re-points a tensor at another storage",
    "set_data": "re-points a tensor at another storage",
    "shallow_copy_data_": "re-points a tensor at another storage",  # torch 2.14
    "rpc_async": "talks to other processes over the network",
    "rpc_sync": "talks to other processes over the network",
    "rpc_remote": "talks to other processes over the network",
    "PythonOp": "calls into the Python interpreter",
    "IgnoredPythonOp": "calls into the Python interpreter",
    "_unsafe_index": "indexes without bounds checks",
    "_unsafe_index_put": "indexes without bounds checks",
    "_unsafe_masked_index": "indexes without bounds checks",
    "_unsafe_masked_index_put_accumulate": "indexes without bounds checks",
    "_nested_view_from_buffer": "builds a view from unchecked offsets",
    "_nested_view_from_buffer_copy": "builds a view from unchecked offsets",
}
# Substrings that deny a torch/ops operator name outright (file, process, network, Python).
_DENY_PATTERN = re.compile(
    r"file|save|load|exec|system|spawn|popen|socket|rpc|python|shell|(?:^|_)open", re.IGNORECASE
)
_UNCHECKED_SPARSE = re.compile(r"^_sparse_\w*_unsafe$")

_PROFILER_OPS = frozenset(
    {
        "_record_function_enter",
        "_record_function_enter_new",
        "_record_function_exit",
        "_call_end_callbacks_on_jit_fut",
    }
)


def denial(name: str) -> str | None:
    """Why ``name`` is refused as an operator, method or attribute name of a value, if it is."""
    if name in _DENIED:
        return _DENIED[name]
    if _UNCHECKED_SPARSE.match(name):
        return "builds a sparse tensor without checking its indices"
    return None


def denied_op(op: str) -> str | None:
    """Why ``op`` is refused as an operator name in any namespace, if it is."""
    denied = denial(op)
    if denied is None and _DENY_PATTERN.search(op):
        denied = "names a file, process, network or Python operation"
    return denied


@functools.lru_cache(maxsize=8192)  # bounded: op names come from untrusted code
def op_problem(namespace: str, op: str) -> str | None:
    """Why operator ``namespace::op`` is refused (None: an allowlisted tensor op)."""
    denied = denied_op(op)
    if denied is not None:
        return f"{namespace}::{op} {denied}"
    table = _OPS.get(namespace)
    if table is None:
        return (
            f"operator namespace {namespace!r} is not aten/prim/quantized: a custom op runs"
            " native code from whatever library registered it"
        )
    if op not in table:
        return f"{namespace}::{op} is not an allowlisted {namespace} operator"
    return None


# Every operator name the supported torch versions register in these namespaces, denied ones
# included (they are refused by op_problem): scan/torch_ops.py, written by tools/torch_ops.py;
# tests/scan/test_tscode.py checks it against the installed torch, so an upgrade that adds
# operators fails loudly instead of silently.
_ATEN_OPS = name_set(torch_ops.ATEN_OPS)
_PRIM_OPS = name_set(torch_ops.PRIM_OPS)
_QUANTIZED_OPS = name_set(torch_ops.QUANTIZED_OPS)
# TorchScript-defined builtins (frontend/builtin_functions.cpp), not in the schema registry.
_ATEN_BUILTINS = frozenset({"_single", "_pair", "_triple", "_quadruple"})
_PRIM_BUILTINS = frozenset({"ndim", "T", "mT", "H", "mH"})

_OPS: dict[str, frozenset[str]] = {
    "aten": _ATEN_OPS | _ATEN_BUILTINS,
    "prim": _PRIM_OPS | _PRIM_BUILTINS,
    "quantized": _QUANTIZED_OPS,
    "profiler": _PROFILER_OPS,
}
