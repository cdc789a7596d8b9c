"""Judging one pickle stream: every import, call, BUILD and unknowable value becomes a finding.

The verdict comes from the allowlist: a global is fine only when it is ``safe``. A class of user
code that the pickle only instantiates (NEWOBJ, ``copyreg._reconstructor``) and fills with BUILD
is ``needs-code``; calling anything that is not known to be harmless, importing a dangerous
name, or computing a name at run time is ``dangerous``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ptconvert.report import Report
from ptconvert.scan.allowlist import classify, danger_reason
from ptconvert.scan.machine import Call, Global, PickleRun, Unknown

SEVERITY_ORDER = {"clean": 0, "needs-code": 1, "error": 2, "dangerous": 3}


@dataclass
class Finding(Report):
    severity: str  # "dangerous" | "needs-code" | "error"
    member: str  # file or archive member path the pickle is in
    offset: int  # byte offset of the opcode within that pickle member
    opcode: str
    global_name: str | None
    reason: str


_INSTANTIATE = frozenset({"NEWOBJ", "NEWOBJ_EX"})
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

    def add(sev: str, pos: int, op: str, g: Global | None, why: str) -> None:
        findings.append(Finding(sev, member, pos, op, _name(g) if g else None, why))

    def verdict_of(g: Global) -> str:
        if g.reason or g.module is None or g.name is None:
            return "dangerous"
        if torchscript and (g.module == "__torch__" or g.module.startswith("__torch__.")):
            return "safe"
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
    if run.error:
        add("error", run.end, "?", None, f"pickle cannot be parsed completely: {run.error}")
    return _dedupe(findings)


def _judge_call(call: Call, add: Any, verdict_of: Any) -> None:
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
        return  # already reported at its import
    args = call.args if isinstance(call.args, tuple) else (call.args,)
    for i, arg in enumerate(args):
        if isinstance(arg, Global) and verdict_of(arg) == "needs-code":
            if name == _RECONSTRUCTOR and i == 0:
                add(
                    "needs-code", call.offset, call.opcode, arg, "instantiates a class of user code"
                )
            else:
                add(
                    "dangerous",
                    call.offset,
                    call.opcode,
                    arg,
                    f"passed to {name}, which may call it",
                )


def _dedupe(findings: list[Finding]) -> list[Finding]:
    seen: set[tuple[str, str | None, str, int]] = set()
    out = []
    for f in findings:
        key = (f.severity, f.global_name, f.reason, f.offset)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def verdict(findings: list[Finding]) -> str:
    worst = max((SEVERITY_ORDER[f.severity] for f in findings), default=0)
    return next(k for k, v in SEVERITY_ORDER.items() if v == worst)
