"""Judging one pickle stream: every import, call, BUILD and unknowable value becomes a finding.

The verdict comes from the allowlist: a global is fine only when it is ``safe``. A class of user
code that the pickle only instantiates (NEWOBJ, ``copyreg._reconstructor``, torch's rebuild of a
tensor subclass, an Enum member rebuilt by value) is ``needs-code``; calling anything that is
not known to be harmless, importing a dangerous name, or computing a name at run time is
``dangerous``. So is a function of user code kept anywhere else (an argument, a state, an
item, a persistent id; a class kept there is ``needs-code``: calling it constructs it): torch's
rebuild code and the objects it builds call what they are given (``ret.as_subclass(new_type)``,
an instance ``__setstate__``, an Enum's ``_missing_``), and once the user trusts the file that
global is importable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ptconvert.pickles.allowlist import classify, danger_reason, is_pure_function, library_class
from ptconvert.pickles.records import (
    MAX_NESTING,
    Call,
    Dict,
    Event,
    Global,
    PersistentRef,
    PickleRun,
    Unknown,
    brief,
)
from ptconvert.report import Report, Verdict

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
KEPT = "a callable of user code kept where torch may call it"
# Why a class of user code is needs-code when the pickle constructs it (what trust admits); a
# class named for any other reason is only kept as a value (``trusted_load`` defers those).
INSTANTIATES = "instantiates a class not on the allowlist, whose code runs"
BY_VALUE = "rebuilds a member of this class from its value (an Enum member)"
CONSTRUCTS = frozenset({INSTANTIATES, BY_VALUE})
MAX_VALUES = 5_000_000  # containers walked per pickle: bounded like the machine's opcodes

# Allowlisted callables that call one of their arguments at load time: position of the callee,
# position of its argument tuple (None: called without arguments we can see).
# ``_rebuild_from_type_v2(func, new_type, args, state)`` runs ``func(*args)``.
_CALLS_ARGUMENT: dict[str, tuple[int, int | None]] = {
    "torch._tensor._rebuild_from_type_v2": (0, 2),
    "collections.defaultdict": (0, None),  # its factory is called for every missing key
}
# Arguments that are instantiated as a class (needs-code is then what it says: user classes):
# the wrapper subclass rebuild and ``copyreg._reconstructor(cls, base, state)`` instantiate
# ``cls``; ``_rebuild_from_type_v2`` makes its result a ``new_type``.
_INSTANTIATES_ARGUMENT: dict[str, int] = {
    _RECONSTRUCTOR: 0,
    "torch._tensor._rebuild_from_type_v2": 1,
    "torch._utils._rebuild_wrapper_subclass": 0,
}
# Arguments that ``torch._utils._set_obj_state`` turns into attributes of the rebuilt tensor.
_SETS_ATTRIBUTES: dict[str, int] = {
    "torch._utils._rebuild_parameter_with_state": 3,
    "torch._tensor._rebuild_from_type_v2": 3,
}
# Attributes that the load itself calls once set on an object: ``as_subclass`` by
# ``_rebuild_from_type_v2``, and every ``__`` name (an instance ``__setstate__`` by BUILD).
_CALLED_ATTRIBUTES = frozenset({"as_subclass"})
# Allowlisted calls that build a class from a namespace (the Enum functional API).
_ENUM_FACTORIES = frozenset({"enum.Enum"})
# Allowlisted calls that build a mapping from their argument and their SETITEMS.
_MAPPINGS = frozenset({"builtins.dict", "collections.OrderedDict"})


def _name(g: Global) -> str:
    return f"{g.module}.{g.name}" if g.module and g.name else g.dotted


def _dotted(value: Any) -> str | None:
    return _name(value) if isinstance(value, Global) else None


def analyse(
    run: PickleRun, member: str, allowed: frozenset[str], *, torchscript: bool = False
) -> list[Finding]:
    """Findings for one pickle run (empty when every global is safe and used safely).

    In a TorchScript archive, ``__torch__.*`` classes are TorchScript's own types: torch's C++
    unpickler resolves them from the archive's code, no Python module is imported.
    """
    judge = _Judge(member, allowed, torchscript)
    for event in run.events:
        judge.event(event)
    judge.kept(run.root, run.end, "STOP", "the unpickled object")
    if run.error:
        judge.add("error", run.end, "?", None, f"pickle cannot be parsed completely: {run.error}")
    return _dedupe(judge.findings)


class _Judge:
    """The findings of one pickle run, event by event."""

    def __init__(self, member: str, allowed: frozenset[str], torchscript: bool) -> None:
        self.member, self.allowed, self.torchscript = member, allowed, torchscript
        self.findings: list[Finding] = []
        self.seen: dict[int, Any] = {}  # containers walked (kept alive: their ids stay theirs)

    def add(self, sev: Verdict, pos: int, op: str, g: Global | None, why: str) -> None:
        self.findings.append(Finding(sev, self.member, pos, op, _name(g) if g else None, why))

    def verdict_of(self, g: Global) -> str:
        if g.reason or g.module is None or g.name is None:
            return "dangerous"
        if self.torchscript and (g.module == "__torch__" or g.module.startswith("__torch__.")):
            return "safe"
        if _name(g) == NESTED_LOADER:
            return "safe"  # its call is judged below; the bytes it loads are scanned in turn
        return classify(g.module, g.name, self.allowed)

    def event(self, event: Event) -> None:
        if event.kind == "import":
            self.imported(event.target)
        elif event.kind == "unknown":
            why = f"cannot be resolved: {event.detail}"
            self.add("dangerous", event.offset, event.opcode, None, why)
        elif event.kind == "call":
            call = event.target
            self.call(call)
            self.kept(call.items, call.offset, "SETITEMS", f"an item set on {_callee(call)}")
            self.kept(call.appends, call.offset, "APPENDS", f"an item added to {_callee(call)}")
        elif event.kind == "build":
            self.build(event)
        elif event.kind == "limit":  # a value no reader walks or hashes in bounded time
            self.add("error", event.offset, event.opcode, None, event.detail)

    def imported(self, g: Global) -> None:
        if g.reason or g.module is None or g.name is None:
            self.add("dangerous", g.offset, g.opcode, g, g.reason or "import cannot be resolved")
        elif (verdict := self.verdict_of(g)) == "dangerous":
            why = danger_reason(g.module, g.name) or "not known to be harmless"
            self.add("dangerous", g.offset, g.opcode, g, why)
        elif verdict == "needs-code":
            library = library_class(_name(g))
            why = f"imports {library}" if library else "imports a module of user code to load"
            self.add("needs-code", g.offset, g.opcode, g, why)

    def build(self, event: Event) -> None:
        target, pos = event.target, event.offset
        if isinstance(target, Global):
            self.add("dangerous", pos, "BUILD", target, "BUILD changes an imported global")
        elif isinstance(target, Unknown):
            self.add("dangerous", pos, "BUILD", None, "BUILD on an unresolvable value")
        elif keys := _special_keys(event.state):
            why = f"BUILD sets special attributes {keys[:3]} (a later BUILD would call them)"
            self.add("dangerous", pos, "BUILD", None, why)
        self.kept(event.state, pos, "BUILD", "a BUILD state")

    def call(self, call: Call, depth: int = 0) -> None:
        """Judge what the call calls and every argument it passes where."""
        func = call.func
        if call.opcode in _INSTANTIATE:
            func = _as_class(func) or func  # a legacy checkpoint's ("module", cls, …) id
        if not isinstance(func, Global):
            why = f"calls a value computed by the pickle ({type(func).__name__})"
            self.add("dangerous", call.offset, call.opcode, None, why)
            return
        verdict, name = self.verdict_of(func), _name(func)
        args = call.args if isinstance(call.args, tuple) else (call.args,)
        if name == NESTED_LOADER:
            if nested_payload(call) is None:
                why = "loads a pickle the scan cannot see"
                self.add("dangerous", call.offset, call.opcode, func, why)
            return
        if verdict == "needs-code":
            self.user_call(call, func, depth)
        elif verdict != "safe":
            if depth:  # one level down the import is reported, but not that it is called
                why = (
                    danger_reason(func.module or "?", func.name or "?")
                    or "not known to be harmless"
                )
                self.add("dangerous", call.offset, call.opcode, func, f"called at load time: {why}")
            return
        else:
            args = self.safe_call(call, func, args, depth)
        for arg in (*args, call.kwargs):
            self.kept(arg, call.offset, call.opcode, f"passed to {name}")

    def user_call(self, call: Call, cls: Global, depth: int) -> None:
        if call.opcode in _INSTANTIATE:
            self.add("needs-code", call.offset, call.opcode, cls, INSTANTIATES)
        elif depth == 0 and _by_value(call, cls):
            self.add("needs-code", call.offset, call.opcode, cls, BY_VALUE)
        else:
            why = "calls a callable not known to be harmless"
            self.add("dangerous", call.offset, call.opcode, cls, why)

    def safe_call(
        self, call: Call, func: Global, args: tuple[Any, ...], depth: int
    ) -> tuple[Any, ...]:
        """Judge the positions an allowlisted callable gives meaning to; the arguments left are
        returned, to be judged as values it keeps."""
        name, pos, op = _name(func), call.offset, call.opcode
        rest = dict(enumerate(args))
        inner = _CALLS_ARGUMENT.get(name)
        if inner is not None and len(args) > inner[0] and depth < 16:
            callee = rest.pop(inner[0])
            inner_args = rest.pop(inner[1], ()) if inner[1] is not None else ()
            # the allowlisted function calls ``callee(*inner_args)``: judge that call as well
            self.call(Call(callee, inner_args, op, pos), depth + 1)
        at = _INSTANTIATES_ARGUMENT.get(name)
        cls = _as_class(rest.get(at)) if at is not None else None
        if cls is not None:
            del rest[at]  # type: ignore[arg-type]
            if self.verdict_of(cls) == "needs-code":
                self.add("needs-code", pos, op, cls, INSTANTIATES)
        attrs = _SETS_ATTRIBUTES.get(name)
        state = args[attrs] if attrs is not None and len(args) > attrs else None
        if keys := _special_keys(state):
            why = f"sets attributes {keys[:3]} on the tensor it rebuilds (the load calls them)"
            self.add("dangerous", pos, op, func, why)
        for g in _globals_within(state):
            if self.verdict_of(g) != "safe":  # an attribute named as a tensor method (set_,
                # as_subclass…) replaces it, and torch's own load calls those methods
                why = "kept as an attribute of the tensor it rebuilds, which torch may call"
                self.add("dangerous", pos, op, g, why)
        if name in _ENUM_FACTORIES and len(args) > 1 and _holds_callable(args[1]):
            why = "builds an Enum class whose namespace holds a callable (its _missing_ runs)"
            self.add("dangerous", pos, op, func, why)
        return tuple(rest.values())

    def kept(self, value: Any, pos: int, op: str, where: str) -> None:
        """Every global of user code inside ``value``, however deep: kept there, it is callable
        by whatever gets the value (a global that is a call's callee or class is judged there).
        Nesting deeper than the readers follow is an error: ``info`` and conversions stop there."""
        stack = [(value, 0)]
        while stack:
            v, depth = stack.pop()
            if isinstance(v, Global):
                if self.verdict_of(v) != "needs-code" or is_pure_function(_name(v)):
                    continue
                if (v.name or "")[:1].isupper():  # a class kept as a value (hparams' nn.GELU):
                    # calling it constructs it, which is what trust admits (the trusted load
                    # allowlists classes only as classes); the special keys are judged apart
                    what = "a library class" if library_class(_name(v)) else "a class of user code"
                    why = f"{what} kept as a value ({where})"
                    self.add("needs-code", pos, op, v, why)
                else:
                    self.add("dangerous", pos, op, v, f"{KEPT} ({where})")
                continue
            if not isinstance(v, (tuple, list, Dict, PersistentRef)) or id(v) in self.seen:
                continue  # a call's own arguments, items and state are judged at its event
            self.seen[id(v)] = v
            if len(self.seen) > MAX_VALUES:
                self.add("error", pos, op, None, "too many nested values to judge")
                return
            if depth >= MAX_NESTING:
                why = f"values nested deeper than {MAX_NESTING} levels, past what ptconvert reads"
                self.add("error", pos, op, None, why)
                return
            if isinstance(v, Dict):
                stack.extend((x, depth + 1) for kv in v.items for x in kv)
            elif isinstance(v, PersistentRef):
                stack.append((v.pid, depth + 1))  # a legacy loader hands part of the id back
            else:
                stack.extend((x, depth + 1) for x in v)


def _callee(call: Call) -> str:
    return _dotted(call.func) or "a computed value"


def _as_class(value: Any) -> Global | None:
    """The class a value stands for where it is instantiated: a global, or the class a legacy
    checkpoint's persistent id hands back (``("module", cls, file, source)`` in the non-tar
    layout; the first item of a tuple id in the tar layout)."""
    if isinstance(value, Global):
        return value
    pid = value.pid if isinstance(value, PersistentRef) else None
    if isinstance(pid, tuple) and len(pid) > 1 and pid[0] in ("module", b"module"):
        return pid[1] if isinstance(pid[1], Global) else None
    if isinstance(pid, tuple) and pid and isinstance(pid[0], Global):
        return pid[0]
    return None


def _by_value(call: Call, cls: Global) -> bool:
    """``Cls(value)`` with one literal: how an Enum member pickles (``IntervalStrategy("steps")``).
    Only a name spelled as a class qualifies: a function called with a path is not construction."""
    args = call.args
    return (
        call.opcode == "REDUCE"
        and (cls.name or "")[:1].isupper()
        and isinstance(args, tuple)
        and len(args) == 1
        and isinstance(args[0], (str, int))
        and call.state is None
        and not call.items
        and not call.appends
    )


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


def _mapping_items(value: Any) -> list[tuple[Any, Any]] | None:
    """The (key, value) pairs of a literal dict or of a ``dict``/``OrderedDict`` call (its
    argument's pairs and its SETITEMS); None for anything else."""
    if isinstance(value, Dict):
        return list(value.items)
    if not isinstance(value, Call) or _dotted(value.func) not in _MAPPINGS:
        return None
    pairs = list(value.items)
    for arg in value.args if isinstance(value.args, tuple) else (value.args,):
        if isinstance(arg, Dict):
            pairs += arg.items
        elif isinstance(arg, (list, tuple)):
            pairs += [p if isinstance(p, tuple) and len(p) == 2 else (p, None) for p in arg]
        else:
            pairs.append((arg, None))  # keys only a call computes: not a literal name
    return pairs


def _special_keys(state: Any) -> list[str]:
    """Attribute names a state would set that the load itself then calls (``__setstate__`` on
    the instance is called by the next BUILD), or keys that are not literal names."""
    names: list[Any] = []
    for part in state if isinstance(state, tuple) else (state,):  # (state, slotstate)
        for key, _ in _mapping_items(part) or ():
            if not isinstance(key, str) or key.startswith("__") or key in _CALLED_ATTRIBUTES:
                names.append(key)
    return [n if isinstance(n, str) else brief(n) for n in names]  # str() of a tuple may not end


_TOO_DEEP = Unknown("more values than the scan follows", -1)


def _leaves(value: Any) -> list[Any]:
    """What literal containers (mappings, tuples, lists) hold, however deep; past 100,000
    values, an Unknown (too much to follow is not literal)."""
    leaves: list[Any] = []
    stack, count = [value], 0
    while stack:
        if count >= 100_000:
            return [*leaves, _TOO_DEEP]
        v = stack.pop()
        count += 1
        pairs = _mapping_items(v)
        if pairs is not None:
            stack += [x for kv in pairs for x in kv]
        elif isinstance(v, (tuple, list)):
            stack += v
        else:
            leaves.append(v)
    return leaves


def _globals_within(value: Any) -> list[Global]:
    return [v for v in _leaves(value) if isinstance(v, Global)]


def _holds_callable(names: Any) -> bool:
    """Whether an Enum namespace holds anything but literals: a global, a computed value."""
    return any(isinstance(v, (Global, Call, PersistentRef, Unknown)) for v in _leaves(names))


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
