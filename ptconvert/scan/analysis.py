"""Judging one pickle stream: every import, call, BUILD and unknowable value becomes a finding.

The verdict comes from the allowlist: a global is fine only when it is ``safe``. A class of user
code that the pickle only instantiates (NEWOBJ, ``copyreg._reconstructor``) and fills with BUILD
is ``needs-code``; calling anything that is not known to be harmless, importing a dangerous
name, or computing a name at run time is ``dangerous``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ptconvert.report import Report, Verdict
from ptconvert.scan.allowlist import classify, danger_reason
from ptconvert.scan.machine import Call, Dict, Global, PickleRun, Unknown

SEVERITY_ORDER: dict[Verdict, int] = {"clean": 0, "needs-code": 1, "error": 2, "dangerous": 3}


@dataclass
class Finding(Report):
    severity: Verdict  # "dangerous" | "needs-code" | "error"
    member: str  # file or archive member path the pickle is in
    offset: int  # byte offset of the opcode within that pickle member
    opcode: str
    global_name: str | None
    reason: str


_INSTANTIATE = frozenset({"NEWOBJ", "NEWOBJ_EX"})
# How plain ``pickle`` writes a tensor: torch.load (weights_only=False) of the torch.save bytes
# it holds. Safe exactly when those literal bytes scan clean, so the scanner scans them too.
NESTED_LOADER = "torch.storage._load_from_bytes"
_RECONSTRUCTOR = "copyreg._reconstructor"


def _name(g: Global) -> str:
    return f"{g.module}.{g.name}" if g.module and g.name else g.dotted


def analyse(
    run: PickleRun, member: str, allowed: frozenset[str], *, torchscript: bool = False
) -> list[Finding]:
    """Findings for one pickle run (empty when every global is safe and used safely).

    In a TorchScript archive, ``__torch__.*`` classes are TorchScript's own types: torch's C++
    unpickler resolves them from the archive's code, no Python module is imported.
    """
    findings: list[Finding] = []

    def add(sev: Verdict, pos: int, op: str, g: Global | None, why: str) -> None:
        findings.append(Finding(sev, member, pos, op, _name(g) if g else None, why))

    def verdict_of(g: Global) -> str:
        if g.reason or g.module is None or g.name is None:
            return "dangerous"
        if torchscript and (g.module == "__torch__" or g.module.startswith("__torch__.")):
            return "safe"
        if f"{g.module}.{g.name}" == NESTED_LOADER:
            return "safe"  # its call is judged below; the bytes it loads are scanned in turn
        return classify(g.module, g.name, allowed)

    for event in run.events:
        if event.kind == "import":
            g = event.target
            assert isinstance(g, Global)
            if g.reason or g.module is None or g.name is None:
                add("dangerous", g.offset, g.opcode, g, g.reason or "import cannot be resolved")
            elif verdict_of(g) == "dangerous":
                why = danger_reason(g.module, g.name) or "not known to be harmless"
                add("dangerous", g.offset, g.opcode, g, why)
            elif verdict_of(g) == "needs-code":
                add("needs-code", g.offset, g.opcode, g, "imports a module of user code to load")
        elif event.kind == "unknown":
            add(
                "dangerous", event.offset, event.opcode, None, f"cannot be resolved: {event.detail}"
            )
        elif event.kind == "call":
            call = event.target
            assert isinstance(call, Call)
            _judge_call(call, add, verdict_of)
        elif event.kind == "build":
            target = event.target
            if isinstance(target, Global):
                add("dangerous", event.offset, "BUILD", target, "BUILD changes an imported global")
            elif isinstance(target, Unknown):
                add("dangerous", event.offset, "BUILD", None, "BUILD on an unresolvable value")
            elif keys := _dunder_keys(event.state):
                add(
                    "dangerous",
                    event.offset,
                    "BUILD",
                    None,
                    f"BUILD sets special attributes {keys[:3]} (a later BUILD would call them)",
                )
    if run.error:
        add("error", run.end, "?", None, f"pickle cannot be parsed completely: {run.error}")
    return _dedupe(findings)


# Allowlisted callables that call one of their arguments at load time: position of the callee,
# position of its argument tuple (None: called without arguments we can see).
# ``_rebuild_from_type_v2(func, new_type, args, state)`` runs ``func(*args)``; the wrapper
# subclass rebuild and ``copyreg._reconstructor(cls, base, state)`` instantiate ``cls``.
_CALLS_ARGUMENT: dict[str, tuple[int, int | None]] = {
    "torch._tensor._rebuild_from_type_v2": (0, 2),
}
# Callables that only store their arguments: classes among them are data, reported at import.
_DATA_CONTAINERS = frozenset(
    {
        "collections.OrderedDict",
        "builtins.dict",
        "builtins.list",
        "builtins.tuple",
        "builtins.set",
        "builtins.frozenset",
    }
)
# Arguments that are instantiated as a class (needs-code is then what it says: user classes).
_INSTANTIATES_ARGUMENT: dict[str, int] = {
    _RECONSTRUCTOR: 0,
    "torch._tensor._rebuild_from_type_v2": 1,
    "torch._utils._rebuild_wrapper_subclass": 0,
}


def _judge_call(call: Call, add: Any, verdict_of: Any, depth: int = 0) -> None:
    func = call.func
    if not isinstance(func, Global):
        kind = type(func).__name__
        add(
            "dangerous",
            call.offset,
            call.opcode,
            None,
            f"calls a value computed by the pickle ({kind})",
        )
        return
    verdict = verdict_of(func)
    name = _name(func)
    if name == NESTED_LOADER:
        if nested_payload(call) is None:
            add("dangerous", call.offset, call.opcode, func, "loads a pickle the scan cannot see")
        return
    if verdict == "needs-code":
        if call.opcode in _INSTANTIATE:
            add("needs-code", call.offset, call.opcode, func, "instantiates a class of user code")
        else:
            add(
                "dangerous",
                call.offset,
                call.opcode,
                func,
                "calls a callable not known to be harmless",
            )
        return
    if verdict != "safe":
        if depth:  # one level down the import is reported, but not that it is called
            why = danger_reason(func.module or "?", func.name or "?") or "not known to be harmless"
            add("dangerous", call.offset, call.opcode, func, f"called at load time: {why}")
        return
    args = call.args if isinstance(call.args, tuple) else (call.args,)
    if name in _DATA_CONTAINERS:
        return  # builds a container from its arguments and calls none of them
    inner = _CALLS_ARGUMENT.get(name)
    if inner is not None and len(args) > inner[0] and depth < 16:
        callee = args[inner[0]]
        inner_args = args[inner[1]] if inner[1] is not None and len(args) > inner[1] else ()
        # the allowlisted function calls ``callee(*inner_args)``: judge that call as well
        _judge_call(Call(callee, inner_args, call.opcode, call.offset), add, verdict_of, depth + 1)
    for i, arg in _globals_in(args):
        if verdict_of(arg) != "needs-code":
            continue
        if _INSTANTIATES_ARGUMENT.get(name) == i:
            add("needs-code", call.offset, call.opcode, arg, "instantiates a class of user code")
        elif inner is None or i != inner[0]:
            add("dangerous", call.offset, call.opcode, arg, f"passed to {name}, which may call it")


def nested_payload(call: Call) -> bytes | None:
    """The literal bytes a nested-loader call hands to torch.load, or None if not literal."""
    args = call.args
    if not isinstance(args, tuple) or len(args) != 1:
        return None
    value = args[0]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    # protocols 0-2 write bytes as _codecs.encode(text, "latin1")
    if isinstance(value, Call) and isinstance(value.func, Global):
        inner = value.args
        if (
            f"{value.func.module}.{value.func.name}" == "_codecs.encode"
            and isinstance(inner, tuple)
            and len(inner) == 2
            and isinstance(inner[0], str)
            and inner[1] in ("latin1", "latin-1")
        ):
            return inner[0].encode("latin1")
    return None


def _globals_in(args: tuple[Any, ...]) -> list[tuple[int, Global]]:
    """Every global among the arguments, with the top-level position it sits under: a callable
    nested in a tuple or list is as callable as one passed directly."""
    out: list[tuple[int, Global]] = []
    for i, arg in enumerate(args):
        stack, seen = [arg], 0
        while stack and seen < 10_000:
            value = stack.pop()
            seen += 1
            if isinstance(value, Global):
                out.append((i, value))
            elif isinstance(value, (tuple, list)):
                stack.extend(value)
            elif isinstance(value, Dict):
                stack.extend(v for kv in value.items for v in kv)
    return out


def _dunder_keys(state: Any) -> list[str]:
    """Attribute names starting with ``__`` that a BUILD would set on an object: an instance
    ``__setstate__`` (or ``__reduce__``…) installed this way is called by the next BUILD."""
    dicts = list(state) if isinstance(state, tuple) else [state]  # (state, slotstate)
    names = []
    for d in dicts:
        if isinstance(d, Dict):
            names += [k for k, _ in d.items if not isinstance(k, str) or k.startswith("__")]
    return [str(n) for n in names]


def _dedupe(findings: list[Finding]) -> list[Finding]:
    seen: set[tuple[str, str | None, str, int]] = set()
    out = []
    for f in findings:
        key = (f.severity, f.global_name, f.reason, f.offset)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def verdict(findings: list[Finding]) -> Verdict:
    worst = max((SEVERITY_ORDER[f.severity] for f in findings), default=0)
    return next(k for k, v in SEVERITY_ORDER.items() if v == worst)
