"""The graphs of a serialized ExportedProgram (``models/<name>.json`` of a .pt2): every node
target, nested graphs' too, judged like TorchScript's operator calls, since running the program
(as verification does) calls each of them.

The operators are judged by the policy of ``code_policy.py``; what else a graph may name is
listed here.
"""

from __future__ import annotations

from ptconvert.scan.code_policy import DANGEROUS, ERROR, CodeFinding, name_set, op_problem

# Graph targets of a serialized ExportedProgram other than operators: higher-order ops and the
# Python operators and symbolic-shape functions torch.export writes for sizes.
_HIGHER_ORDER = name_set(
    "cond while_loop map_impl scan associative_scan wrap_with_set_grad_enabled "
    "wrap_with_autocast invoke_subgraph run_const_graph auto_functionalized "
    "auto_functionalized_v2 with_effects"
)
_PY_TARGETS = name_set(
    "_operator.getitem _operator.add _operator.sub _operator.mul _operator.truediv "
    "_operator.floordiv _operator.mod _operator.pow _operator.neg _operator.pos _operator.abs "
    "_operator.eq _operator.ne _operator.lt _operator.le _operator.gt _operator.ge "
    "_operator.and_ _operator.or_ _operator.not_ _operator.invert math.ceil math.floor "
    "math.trunc math.sqrt torch.sym_float torch.sym_int torch.sym_max torch.sym_min "
    "torch.sym_not torch.sym_ite torch.sym_sqrt torch._sym_sqrt"
)


def analyse_program(data: bytes) -> list[CodeFinding]:
    """Findings for a serialized ExportedProgram (``models/<name>.json`` of a .pt2): every node
    target of every graph, nested ones included, judged like TorchScript's operator calls, since
    running the program (as verification does) calls each of them. ``line`` is the node's
    position in its graph."""
    import json

    try:
        program = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return [CodeFinding(ERROR, 1, None, f"serialized program is not JSON ({exc})")]
    findings: list[CodeFinding] = []
    stack, seen = [program], 0
    while stack and seen < 5_000_000:
        value = stack.pop()
        seen += 1
        if isinstance(value, list):
            stack.extend(value)
            continue
        if not isinstance(value, dict):
            continue
        nodes = value.get("nodes")
        if isinstance(nodes, list):
            for i, node in enumerate(nodes):
                target = node.get("target") if isinstance(node, dict) else None
                why = _target_problem(target)
                if why is not None:
                    findings.append(CodeFinding(DANGEROUS, i + 1, str(target)[:200], why))
        stack.extend(value.values())
    return findings


def _target_problem(target: object) -> str | None:
    if not isinstance(target, str):
        return "a graph node without an operator name"
    if target in _PY_TARGETS:
        return None
    parts = target.split(".")
    if len(parts) >= 4 and parts[:2] == ["torch", "ops"]:
        namespace, op = parts[2], parts[3]
        if namespace == "higher_order":
            return None if op in _HIGHER_ORDER else f"unknown higher-order op {op!r}"
        return op_problem(namespace, op)
    return "not an allowlisted operator: running the program would call it"
