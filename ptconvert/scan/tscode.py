"""Judge the TorchScript source members (``code/**.py``) of a ``torch.jit.save`` archive.

``torch.jit.load`` compiles these members and runs any ``__setstate__`` they define while it
unpickles ``data.pkl``, so an archive whose pickles are clean can still create files (e.g.
``torch.from_file(path, shared=True, size=n)`` or ``torch.save``) the moment it is loaded, and
``forward`` code runs when ptconvert verifies a conversion. Nothing here imports torch or runs the
code: each member is parsed with :mod:`ast` and every name it resolves is judged the way the
TorchScript importer resolves it (``torch.X`` and ``torch.autograd.X`` are ``aten::X``,
``ops.NS.X`` is ``NS::X``, ``getattr(obj, "X")`` is ``obj.X``, ``__torch__.*`` is code of the
archive itself or a torchbind class under ``__torch__.torch.classes``).

Policy (allowlist, fail closed): an operator is allowed only when it is listed below for its
namespace (every ``aten``/``prim``/``quantized`` operator torch 2.13 or 2.14 registers, plus the
profiler's record_function ops) and is not denied (file, process, network, global RNG/cache
state, storage re-pointing, checks skipped); any other namespace is a custom op from some native
library. Names, statements and expressions TorchScript never writes are refused too. Code that
runs at load time, before anybody asked for the model to run, is held to stricter rules:
``__setstate__`` (and the methods of its own class it calls), default argument values (the
importer evaluates them when it compiles a method) and class-body values may only assign
attributes of ``self`` and call allowlisted operators and pure builtins.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, replace

from ptconvert.report import Verdict


def _names(text: str) -> frozenset[str]:
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

# The names the TorchScript compiler and importer resolve without any import.
_BUILTINS = _names(
    "print tuple float int bool str complex getattr hasattr isinstance _to_tensor len hex oct round"
    " hash id min max abs all any divmod sum list dict ord chr bin pow range zip enumerate"
    " rangelist sorted AssertionError annotate unchecked_cast uninitialized inf nan"
)
# fork/awaitable run a closure defined in the same function (judged like the rest of it).
_TASKS = frozenset({"fork", "awaitable"})
# Type names: harmless in annotations and in annotate()/unchecked_cast()/isinstance().
_TYPES = _names(
    "Tensor int float bool complex str Device Stream number None NoneType Any Capsule list tuple"
    " dict List Dict Tuple Optional Union Final Future Await RRef Generator Storage ScalarType"
    " Layout MemoryFormat QScheme Scalar AnyEnumType AnyClassType Quantizer"
)
_BASES = frozenset({"Module", "NamedTuple", "Interface", "ModuleInterface", "Enum"})
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
_TORCH_SUBMODULES = _names(
    "nn functional _C _nn _fft _linalg _special _VariableFunctions fft linalg special"
)
_PROFILER_OPS = frozenset(
    {
        "_record_function_enter",
        "_record_function_enter_new",
        "_record_function_exit",
        "_call_end_callbacks_on_jit_fut",
    }
)
# Names the printer never binds locally (it renames such variables ops0, getattr0, ...).
_RESERVED = _names(
    "torch ops CONSTANTS __torch__ fork awaitable getattr inf nan uninitialized unchecked_cast"
)
_CONSTANT = re.compile(r"^c\d+$")
_LOAD_TIME = "__setstate__"


def analyse_code(source: str) -> list[CodeFinding]:
    """Findings for one TorchScript code member (empty = nothing but allowlisted tensor ops)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        line = getattr(exc, "lineno", None) or 1
        why = str(exc) or type(exc).__name__
        return [CodeFinding(ERROR, line, None, f"unparseable TorchScript code: {why}")]
    analyser = _Analyser()
    try:
        analyser.module(tree)
    except RecursionError:
        return [CodeFinding(ERROR, 1, None, "TorchScript code nested too deeply to judge")]
    return analyser.result()


def analyse_code_bytes(data: bytes) -> list[CodeFinding]:
    """:func:`analyse_code` for a raw zip member; torch writes UTF-8, anything else is refused."""
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [CodeFinding(ERROR, 1, None, f"unparseable TorchScript code (not UTF-8: {exc})")]
    return analyse_code(source)


# Graph targets of a serialized ExportedProgram other than operators: higher-order ops and the
# Python operators and symbolic-shape functions torch.export writes for sizes.
_HIGHER_ORDER = _names(
    "cond while_loop map_impl scan associative_scan wrap_with_set_grad_enabled "
    "wrap_with_autocast invoke_subgraph run_const_graph auto_functionalized "
    "auto_functionalized_v2 with_effects"
)
_PY_TARGETS = _names(
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
        return _op_problem(namespace, op)
    return "not an allowlisted operator: running the program would call it"


def _denial(name: str) -> str | None:
    """Why ``name`` is refused as an operator, method or attribute name of a value, if it is."""
    if name in _DENIED:
        return _DENIED[name]
    if _UNCHECKED_SPARSE.match(name):
        return "builds a sparse tensor without checking its indices"
    return None


def _denied_op(op: str) -> str | None:
    """Why ``op`` is refused as an operator name in any namespace, if it is."""
    denied = _denial(op)
    if denied is None and _DENY_PATTERN.search(op):
        denied = "names a file, process, network or Python operation"
    return denied


@functools.lru_cache(maxsize=8192)  # bounded: op names come from untrusted code
def _op_problem(namespace: str, op: str) -> str | None:
    """Why operator ``namespace::op`` is refused (None: an allowlisted tensor op)."""
    denied = _denied_op(op)
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


@dataclass(frozen=True)
class _Context:
    """Where the walker is: the names local to the function, and whether it runs at load time."""

    local: frozenset[str]
    self_name: str | None = None
    methods: frozenset[str] = frozenset()
    load_time: str | None = None  # e.g. "__setstate__ -> helper": code torch.jit.load runs


def _assigned_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Parameters and every name the body binds (flow-insensitive; nested defs by name only)."""
    args = fn.args
    names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    names.update(a.arg for a in (args.vararg, args.kwarg) if a is not None)
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        stack.extend(ast.iter_child_nodes(node))
    return names


def _self_calls(fn: ast.FunctionDef, self_name: str, methods: set[str]) -> set[str]:
    """Methods of the same class that ``fn`` calls as ``self.m(...)``."""
    called = set()
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == self_name
            and node.func.attr in methods
        ):
            called.add(node.func.attr)
    return called


def _first_param(fn: ast.FunctionDef) -> str | None:
    params = [*fn.args.posonlyargs, *fn.args.args]
    return params[0].arg if params else None


class _Analyser:
    """Walks one member's AST and collects findings; every unknown construct is a finding."""

    def __init__(self) -> None:
        self._found: dict[tuple[int, str | None], CodeFinding] = {}  # first reason wins

    def result(self) -> list[CodeFinding]:
        return sorted(self._found.values(), key=lambda f: (f.line, f.name or "", f.reason))

    def _flag(self, node: ast.AST, name: str | None, reason: str, ctx: _Context | None) -> None:
        if ctx is not None and ctx.load_time is not None:
            reason = f"{reason} (in {ctx.load_time}, which torch.jit.load runs)"
        line = getattr(node, "lineno", 1)
        self._found.setdefault((line, name), CodeFinding(DANGEROUS, line, name, reason))

    # -- module and class level -------------------------------------------------------------

    def module(self, tree: ast.Module) -> None:
        top = _Context(frozenset())
        for stmt in tree.body:
            if isinstance(stmt, ast.ClassDef):
                self._class(stmt)
            elif isinstance(stmt, ast.FunctionDef):
                self._function(stmt, top)
            elif isinstance(stmt, ast.Import | ast.ImportFrom):
                self._import(stmt)
            elif (
                isinstance(stmt, ast.Assign)
                and [_name_of(t) for t in stmt.targets] == ["op_version_set"]
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, int)
            ):
                continue  # old archives start with "op_version_set = N"; the importer skips it
            elif not _is_inert(stmt):
                self._flag(stmt, type(stmt).__name__, "statement TorchScript never writes", None)

    def _import(self, stmt: ast.Import | ast.ImportFrom) -> None:
        """Old archives wrote ``import __torch__...`` lines, which the importer skips."""
        modules = (
            [a.name for a in stmt.names] if isinstance(stmt, ast.Import) else [stmt.module or ""]
        )
        for module in modules:
            if module.split(".")[0] not in {"__torch__", "torch"}:
                self._flag(stmt, module, "import of a non-torch module", None)

    def _class(self, cls: ast.ClassDef) -> None:
        for base in cls.bases:
            if _name_of(base) not in _BASES:
                self._flag(cls, ast.unparse(base), "class base TorchScript never writes", None)
        for deco in cls.decorator_list:
            self._flag(deco, ast.unparse(deco), "decorator TorchScript never writes", None)
        for kw in cls.keywords:
            self._flag(cls, kw.arg, "class keyword TorchScript never writes", None)
        methods = {s.name: s for s in cls.body if isinstance(s, ast.FunctionDef)}
        strict = self._load_time_methods(methods)
        body = _Context(frozenset(), load_time=f"the body of class {cls.name}")
        for stmt in cls.body:
            if isinstance(stmt, ast.FunctionDef):
                self_name = _first_param(stmt)
                ctx = _Context(frozenset(), self_name, frozenset(methods), strict.get(stmt.name))
                self._function(stmt, ctx)
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                self._expr(stmt.annotation, body)  # "w : Tensor", "n : Final[int] = 3"
                if stmt.value is not None:
                    self._expr(stmt.value, body)
            elif isinstance(stmt, ast.Assign) and all(map(_class_target, stmt.targets)):
                self._expr(stmt.value, body)  # __parameters__, __annotations__["0"], enum values
            elif not _is_inert(stmt):
                self._flag(
                    stmt, type(stmt).__name__, "class statement TorchScript never writes", None
                )

    def _load_time_methods(self, methods: dict[str, ast.FunctionDef]) -> dict[str, str]:
        """``__setstate__`` and the methods it reaches through ``self``, with how it got there."""
        if _LOAD_TIME not in methods:
            return {}
        reached = {_LOAD_TIME: _LOAD_TIME}
        todo = [_LOAD_TIME]
        while todo:
            name = todo.pop()
            fn = methods[name]
            self_name = _first_param(fn)
            if self_name is None:
                continue
            for callee in sorted(_self_calls(fn, self_name, set(methods))):
                if callee not in reached:
                    reached[callee] = f"{_LOAD_TIME} -> {callee}"
                    todo.append(callee)
        return reached

    # -- functions and statements -----------------------------------------------------------

    def _function(self, fn: ast.FunctionDef, outer: _Context) -> None:
        local = outer.local | _assigned_names(fn)
        ctx = _Context(local - _RESERVED, outer.self_name, outer.methods, outer.load_time)
        if local & _RESERVED:
            self._rebinds(fn, ctx)
        for deco in fn.decorator_list:
            self._flag(deco, ast.unparse(deco), "decorator TorchScript never writes", ctx)
        args = fn.args
        for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
            if arg is not None and arg.annotation is not None:
                self._expr(arg.annotation, ctx)
        # defaults are evaluated when the importer compiles the method, i.e. at load time
        defaults = replace(ctx, load_time=ctx.load_time or f"the defaults of {fn.name}")
        for default in (*args.defaults, *args.kw_defaults):
            if default is not None:
                self._expr(default, defaults)
        if fn.returns is not None:
            self._expr(fn.returns, ctx)
        self._block(fn.body, ctx)

    def _rebinds(self, fn: ast.FunctionDef, ctx: _Context) -> None:
        """Flag local bindings of the names the importer resolves (the printer never binds them).

        A local ``ops`` or ``torch`` would turn every later ``ops.myns.op`` into an attribute of a
        local value; they stay judged as globals, and the binding itself is refused.
        """
        for node in ast.walk(fn):
            bound: str | None = None
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                bound = node.id
            elif isinstance(node, ast.arg):
                bound = node.arg
            elif isinstance(node, ast.FunctionDef) and node is not fn:
                bound = node.name
            if bound in _RESERVED:
                self._flag(node, bound, "rebinds a name the TorchScript importer resolves", ctx)

    def _block(self, body: list[ast.stmt], ctx: _Context) -> None:
        for stmt in body:
            self._stmt(stmt, ctx)

    def _stmt(self, stmt: ast.stmt, ctx: _Context) -> None:
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                self._target(target, ctx)
            self._expr(stmt.value, ctx)
        elif isinstance(stmt, ast.AnnAssign):
            self._target(stmt.target, ctx)
            self._expr(stmt.annotation, ctx)
            if stmt.value is not None:
                self._expr(stmt.value, ctx)
        elif isinstance(stmt, ast.AugAssign):
            self._target(stmt.target, ctx)
            self._expr(stmt.value, ctx)
        elif isinstance(stmt, ast.Expr | ast.Return):
            if stmt.value is not None:
                self._expr(stmt.value, ctx)
        elif isinstance(stmt, ast.If | ast.While):
            self._expr(stmt.test, ctx)
            self._block(stmt.body, ctx)
            self._block(stmt.orelse, ctx)
        elif isinstance(stmt, ast.For):
            self._target(stmt.target, ctx)
            self._expr(stmt.iter, ctx)
            self._block(stmt.body, ctx)
            self._block(stmt.orelse, ctx)
        elif isinstance(stmt, ast.With):
            if ctx.load_time is not None:
                self._flag(stmt, "with", "enters a context manager", ctx)
            for item in stmt.items:
                self._expr(item.context_expr, ctx)
                if item.optional_vars is not None:
                    self._target(item.optional_vars, ctx)
            self._block(stmt.body, ctx)
        elif isinstance(stmt, ast.Assert):
            self._expr(stmt.test, ctx)
            if stmt.msg is not None:
                self._expr(stmt.msg, ctx)
        elif isinstance(stmt, ast.Raise):
            for part in (stmt.exc, stmt.cause):
                if part is not None:
                    self._expr(part, ctx)
        elif isinstance(stmt, ast.Delete):
            for target in stmt.targets:
                self._target(target, ctx)
        elif isinstance(stmt, ast.FunctionDef):  # closures, e.g. the body of a fork()
            self._function(stmt, ctx)
        elif not isinstance(stmt, ast.Pass | ast.Break | ast.Continue):
            self._flag(stmt, type(stmt).__name__, "statement TorchScript never writes", ctx)

    def _target(self, target: ast.expr, ctx: _Context) -> None:
        if isinstance(target, ast.Name):
            return
        if isinstance(target, ast.Tuple | ast.List):
            for elt in target.elts:
                self._target(elt, ctx)
        elif isinstance(target, ast.Starred):
            self._target(target.value, ctx)
        elif isinstance(target, ast.Attribute):
            owner = target.value
            own = isinstance(owner, ast.Name) and owner.id == ctx.self_name
            if ctx.load_time is not None and not own:
                self._flag(target, _dotted(target), "writes an attribute of another object", ctx)
            self._expr(owner, ctx)
        elif isinstance(target, ast.Subscript):
            self._expr(target.value, ctx)
            self._expr(target.slice, ctx)
        else:
            self._flag(target, type(target).__name__, "assignment target never written", ctx)

    # -- expressions ------------------------------------------------------------------------

    def _expr(self, node: ast.expr, ctx: _Context) -> None:
        if isinstance(node, ast.Constant):
            return
        if isinstance(node, ast.Name | ast.Attribute) or _as_getattr(node, ctx) is not None:
            self._reference(node, ctx)
        elif isinstance(node, ast.Call):
            self._call(node, ctx)
        elif isinstance(node, ast.Lambda | ast.NamedExpr | ast.Await | ast.Yield | ast.YieldFrom):
            self._flag(node, type(node).__name__, "expression TorchScript never writes", ctx)
        elif isinstance(
            node,
            ast.Subscript
            | ast.BinOp
            | ast.UnaryOp
            | ast.BoolOp
            | ast.Compare
            | ast.IfExp
            | ast.Tuple
            | ast.List
            | ast.Set
            | ast.Dict
            | ast.Slice
            | ast.Starred
            | ast.JoinedStr
            | ast.FormattedValue
            | ast.ListComp
            | ast.DictComp
            | ast.SetComp
            | ast.GeneratorExp
            | ast.comprehension,
        ):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr | ast.comprehension):
                    self._expr(child, ctx)  # type: ignore[arg-type]
        else:
            self._flag(node, type(node).__name__, "expression TorchScript never writes", ctx)

    def _call(self, node: ast.Call, ctx: _Context) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id == "getattr" and "getattr" not in ctx.local:
            # getattr(obj, "x") is obj.x (handled by _reference); anything else cannot be judged
            self._flag(node, "getattr", "getattr with a computed or extra argument", ctx)
        else:
            self._expr(func, ctx)
        if ctx.load_time is not None:
            self._load_time_call(func, ctx)
        for arg in node.args:
            self._expr(arg, ctx)
        for kw in node.keywords:
            self._expr(kw.value, ctx)

    def _load_time_call(self, func: ast.expr, ctx: _Context) -> None:
        """Inside ``__setstate__`` only allowlisted operators, builtins and own methods run."""
        link = _as_getattr(func, ctx)
        root, attrs = _chain(func, ctx)
        name = _render(root, attrs)
        if isinstance(root, ast.Name) and root.id not in ctx.local:
            if root.id in {"torch", "ops"} or (root.id in _BUILTINS and not attrs):
                return  # operators were judged by _reference; builtins are pure
            self._flag(func, name, "calls something other than a tensor op", ctx)
        elif isinstance(root, ast.Name) and root.id == ctx.self_name and len(attrs) == 1:
            # self.m(...) only: getattr(self, "m") would escape _load_time_methods' reach
            if attrs[0] not in ctx.methods or link is not None:
                self._flag(func, name, "calls something other than a method of its class", ctx)
        elif attrs and link is None and _op_problem("aten", attrs[-1]) is None:
            return  # a tensor/list/str method, i.e. an aten operator on that value
        elif attrs and link is None and _op_problem("prim", attrs[-1]) is None:
            return
        else:
            self._flag(func, name, "calls a method of another object or a local value", ctx)

    def _reference(self, node: ast.expr, ctx: _Context) -> None:
        """Judge a name or an attribute chain as the importer resolves it."""
        root, attrs = _chain(node, ctx)
        name = _render(root, attrs)
        if isinstance(root, ast.Name) and root.id not in ctx.local:
            problem = self._global(root.id, attrs)
            if problem is not None:
                self._flag(node, name, problem, ctx)
        elif not isinstance(root, ast.Name):
            self._expr(root, ctx)
        for attr in attrs:  # x.save(...), getattr(x, "from_file"): refused on any value
            denied = _denial(attr)
            if denied is not None:
                self._flag(node, name, f"{attr!r} {denied}", ctx)

    def _global(self, root: str, attrs: list[str]) -> str | None:
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
        if root in _BUILTINS or root in _TYPES or root in _TASKS:
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
        return _op_problem("aten", attrs[0])
    *path, leaf = attrs
    if not set(path) <= _TORCH_SUBMODULES:
        return f"unknown torch namespace {'.'.join(path)!r}"
    problem = _op_problem("aten", leaf)
    if problem is None or _denied_op(leaf):
        return problem
    # torch.fft.fft / torch.linalg.norm / torch.special.erf are aten::fft_fft, linalg_norm, ...
    return None if _op_problem("aten", f"{path[-1].lstrip('_')}_{leaf}") is None else problem


def _ops_problem(attrs: list[str], spelled: str) -> str | None:
    if len(attrs) < 2:
        return f"{spelled} namespace used as a value (aliases defeat name checks)"
    if len(attrs) > 2:
        return f"{spelled}.{'.'.join(attrs)} is not an operator"
    return _op_problem(attrs[0], attrs[1])


def _class_problem(attrs: list[str]) -> str | None:
    if len(attrs) >= 2 and (attrs[0], attrs[1]) in _KNOWN_CLASSES:
        return None
    return (
        f"torchbind class {'.'.join(attrs) or '(none)'!r} is not one of the known quantized/"
        "profiler classes: its methods are native code from the library that registered it"
    )


def _as_getattr(node: ast.AST, ctx: _Context) -> tuple[ast.expr, str] | None:
    """``getattr(obj, "name")`` (the builtin, constant name) as ``(obj, name)``."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and "getattr" not in ctx.local
        and len(node.args) == 2
        and not node.keywords
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        return node.args[0], node.args[1].value
    return None


def _chain(node: ast.expr, ctx: _Context) -> tuple[ast.expr, list[str]]:
    """Split ``a.b.c`` / ``getattr(getattr(a, "b"), "c")`` into the root and the names."""
    attrs: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
            continue
        link = _as_getattr(node, ctx)
        if link is None:
            break
        node, attr = link
        attrs.append(attr)
    return node, attrs[::-1]


def _render(root: ast.expr, attrs: list[str]) -> str:
    head = root.id if isinstance(root, ast.Name) else f"({ast.unparse(root)})"
    return ".".join([head, *attrs])


def _dotted(node: ast.expr) -> str:
    return ast.unparse(node)


def _name_of(node: ast.expr) -> str | None:
    return node.id if isinstance(node, ast.Name) else None


def _class_target(target: ast.expr) -> bool:
    """Class-body assignment targets torch writes: names and ``__annotations__["0"]``."""
    if isinstance(target, ast.Name):
        return True
    return (
        isinstance(target, ast.Subscript)
        and _name_of(target.value) == "__annotations__"
        and isinstance(target.slice, ast.Constant)
        and isinstance(target.slice.value, str)
    )


def _is_inert(stmt: ast.stmt) -> bool:
    """``pass`` and bare constants (interface bodies, docstrings) do nothing."""
    return isinstance(stmt, ast.Pass) or (
        isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
    )


# Every operator name torch 2.13 or 2.14 registers in these namespaces
# (torch._C._jit_get_all_schemas(); the union, so aten::cholesky and aten::qr, gone in 2.14, still
# pass in archives 2.13 wrote), denied ones included (they are refused by _op_problem);
# tests/scan/test_tscode.py checks this against the installed torch, so an upgrade that adds
# operators fails loudly instead of silently. Sorted, wrapped at 96 columns.
_ATEN_OPS = _names(
    """
Bool Complex ComplexImplicit Delete Float FloatImplicit Generator Int IntImplicit ScalarImplicit
Size __and__ __contains__ __derive_index __getitem__ __iand__ __ilshift__ __interpolate __ior__
__irshift__ __is__ __isnot__ __ixor__ __lshift__ __not__ __or__ __range_length
__round_to_zero_floordiv __rshift__ __upsample __upsample_bilinear __upsample_nearest __xor__
_adaptive_avg_pool2d _adaptive_avg_pool2d_backward _adaptive_avg_pool3d
_adaptive_avg_pool3d_backward _add_batch_dim _add_relu _add_relu_ _addmm_activation _aminmax
_amp_foreach_non_finite_check_and_unscale _amp_foreach_non_finite_check_and_unscale_
_amp_update_scale _amp_update_scale_ _assert_async _assert_scalar _assert_tensor_metadata
_autocast_to_full_precision _autocast_to_reduced_precision _backward _batch_norm_impl_index
_batch_norm_impl_index_backward _batch_norm_no_update _batch_norm_with_update
_batch_norm_with_update_functional _cast_Byte _cast_Char _cast_Double _cast_Float _cast_Half
_cast_Int _cast_Long _cast_Short _cdist_backward _cdist_forward _cholesky_solve_helper
_choose_qparams_per_tensor _chunk_cat _coalesce _coalesced _coalesced_
_compute_linear_combination _conj _conj_copy _conj_physical _conv_depthwise2d
_convert_indices_from_coo_to_csr _convert_indices_from_csr_to_coo _convert_weight_to_int4pack
_convert_weight_to_int4pack_for_cpu _convolution _convolution_double_backward _convolution_mode
_copy_from _copy_from_and_resize _cslt_compress _cslt_sparse_mm _cslt_sparse_mm_search _ctc_loss
_ctc_loss_backward _cudnn_attention_backward _cudnn_attention_forward _cudnn_ctc_loss
_cudnn_init_dropout_state _cudnn_rnn _cudnn_rnn_backward _cudnn_rnn_flatten_weight
_cufft_clear_plan_cache _cufft_get_plan_cache_max_size _cufft_get_plan_cache_size
_cufft_set_plan_cache_max_size _cummax_helper _cummin_helper _debug_has_internal_overlap _dimI
_dimV _dim_arange _dirichlet_grad _dyn_quant_matmul_4bit _dyn_quant_pack_4bit_weight
_efficient_attention_backward _efficient_attention_forward _efficientzerotensor _embedding_bag
_embedding_bag_backward _embedding_bag_dense_backward _embedding_bag_forward_only
_embedding_bag_per_sample_weights_backward _embedding_bag_sparse_backward
_empty_affine_quantized _empty_per_channel_affine_quantized _euclidean_dist
_fake_quantize_learnable_per_channel_affine _fake_quantize_learnable_per_channel_affine_backward
_fake_quantize_learnable_per_tensor_affine _fake_quantize_learnable_per_tensor_affine_backward
_fake_quantize_per_tensor_affine_cachemask_tensor_qparams _fft_c2c _fft_c2r _fft_r2c
_fill_mem_eff_dropout_mask_ _flash_attention_backward _flash_attention_forward
_flash_attention_forward_no_dropout_inplace _foobar _foreach_abs _foreach_abs_ _foreach_acos
_foreach_acos_ _foreach_add _foreach_add_ _foreach_addcdiv _foreach_addcdiv_ _foreach_addcmul
_foreach_addcmul_ _foreach_asin _foreach_asin_ _foreach_atan _foreach_atan_ _foreach_ceil
_foreach_ceil_ _foreach_clamp_max _foreach_clamp_max_ _foreach_clamp_min _foreach_clamp_min_
_foreach_clone _foreach_copy _foreach_copy_ _foreach_cos _foreach_cos_ _foreach_cosh
_foreach_cosh_ _foreach_div _foreach_div_ _foreach_erf _foreach_erf_ _foreach_erfc
_foreach_erfc_ _foreach_exp _foreach_exp_ _foreach_expm1 _foreach_expm1_ _foreach_floor
_foreach_floor_ _foreach_frac _foreach_frac_ _foreach_lerp _foreach_lerp_ _foreach_lgamma
_foreach_lgamma_ _foreach_log _foreach_log10 _foreach_log10_ _foreach_log1p _foreach_log1p_
_foreach_log2 _foreach_log2_ _foreach_log_ _foreach_max _foreach_maximum _foreach_maximum_
_foreach_minimum _foreach_minimum_ _foreach_mm _foreach_mul _foreach_mul_ _foreach_neg
_foreach_neg_ _foreach_norm _foreach_pow _foreach_pow_ _foreach_powsum _foreach_reciprocal
_foreach_reciprocal_ _foreach_round _foreach_round_ _foreach_rsqrt _foreach_rsqrt_
_foreach_sigmoid _foreach_sigmoid_ _foreach_sign _foreach_sign_ _foreach_sin _foreach_sin_
_foreach_sinh _foreach_sinh_ _foreach_sqrt _foreach_sqrt_ _foreach_sub _foreach_sub_
_foreach_tan _foreach_tan_ _foreach_tanh _foreach_tanh_ _foreach_trunc _foreach_trunc_
_foreach_zero _foreach_zero_ _functional_assert_async _functional_assert_scalar
_functional_sym_constrain_range _functional_sym_constrain_range_for_size _fused_adagrad
_fused_adagrad_ _fused_adam _fused_adam_ _fused_adamw _fused_adamw_ _fused_dropout
_fused_moving_avg_obs_fq_helper _fused_moving_avg_obs_fq_helper_functional _fused_rms_norm
_fused_rms_norm_backward _fused_sdp_choice _fused_sgd _fused_sgd_ _fw_primal _fw_primal_copy
_gather_sparse_backward _get_cpu_capability _get_tracing_state _grad_sum_to_size
_grid_sampler_2d_cpu_fallback _grid_sampler_2d_cpu_fallback_backward _grouped_mm
_has_compatible_shallow_copy_type _has_same_storage_numel _histogramdd_bin_edges
_histogramdd_from_bin_cts _histogramdd_from_bin_tensors _index_put_impl _index_put_impl_
_indices _indices_copy _infer_size _int_mm _is_all_true _is_any_true _is_zerotensor
_jagged_to_padded_dense_forward _lazy_clone _linalg_check_errors _linalg_det _linalg_eigh
_linalg_eigvals _linalg_slogdet _linalg_solve_ex _linalg_svd _list_to_tensor _local_scalar_dense
_log_softmax _log_softmax_backward_data _logcumsumexp _lstm_mps _lu_with_info _make_dep_token
_make_dual _make_dual_copy _make_per_channel_quantized_tensor _make_per_tensor_quantized_tensor
_masked_scale _masked_softmax _masked_softmax_backward _mixed_dtypes_linear _mkldnn_reshape
_mkldnn_transpose _mkldnn_transpose_ _mps_convolution _mps_convolution_transpose
_native_batch_norm_legit _native_batch_norm_legit_functional
_native_batch_norm_legit_no_training _native_multi_head_attention _ncf_unsqueeze _ncf_view
_neg_view _neg_view_copy _nested_compute_contiguous_strides_offsets _nested_from_padded
_nested_from_padded_and_nested_example _nested_from_padded_tensor _nested_get_jagged_dummy
_nested_get_lengths _nested_get_max_seqlen _nested_get_min_seqlen _nested_get_offsets
_nested_get_ragged_idx _nested_get_values _nested_get_values_copy _nested_select_backward
_nested_sum_backward _nested_tensor_from_mask _nested_tensor_from_mask_left_aligned
_nested_tensor_from_tensor_list _nested_tensor_size _nested_tensor_softmax_with_shape
_nested_tensor_storage_offsets _nested_tensor_strides _nested_view_from_buffer
_nested_view_from_buffer_copy _nested_view_from_jagged _nested_view_from_jagged_copy
_new_zeros_with_same_feature_meta _nnpack_available _nnpack_spatial_convolution _nnz
_no_grad_embedding_renorm_ _no_grad_fill_ _no_grad_normal_ _no_grad_uniform_ _no_grad_zero_
_pack_padded_sequence _pack_padded_sequence_backward _pack_sequence _pad_circular _pad_enum
_pad_packed_sequence _padded_dense_to_jagged_forward _pdist_backward _pdist_forward
_philox_key_fold_in _philox_key_split _philox_normal _philox_normal_ _philox_uniform
_philox_uniform_ _pin_memory _prelu_kernel _prelu_kernel_backward _print _propagate_xla_data
_remove_batch_dim _reshape_alias _reshape_alias_copy _reshape_copy _reshape_from_tensor
_resize_output _resize_output_ _rowwise_prune _safe_softmax _sample_dirichlet
_saturate_weight_to_fp16 _scaled_dot_product_attention_math
_scaled_dot_product_attention_math_for_mps _scaled_dot_product_cudnn_attention
_scaled_dot_product_cudnn_attention_backward _scaled_dot_product_efficient_attention
_scaled_dot_product_efficient_attention_backward _scaled_dot_product_flash_attention
_scaled_dot_product_flash_attention_backward _scaled_dot_product_flash_attention_for_cpu
_scaled_dot_product_flash_attention_for_cpu_backward
_scaled_dot_product_fused_attention_overrideable
_scaled_dot_product_fused_attention_overrideable_backward _scaled_grouped_mm
_scaled_grouped_mm_v2 _scaled_mm _scaled_mm_v2 _segment_reduce_backward _set_item
_shape_as_tensor _size_if_not_equal _slow_conv2d_backward _slow_conv2d_forward
_sobol_engine_draw _sobol_engine_ff_ _sobol_engine_initialize_state_ _sobol_engine_scramble_
_softmax _softmax_backward_data _sparse_addmm _sparse_broadcast_to _sparse_broadcast_to_copy
_sparse_bsc_tensor_unsafe _sparse_bsr_tensor_unsafe _sparse_compressed_tensor_unsafe
_sparse_compressed_tensor_with_dims _sparse_coo_tensor_unsafe _sparse_coo_tensor_with_dims
_sparse_coo_tensor_with_dims_and_tensors _sparse_csc_tensor_unsafe _sparse_csr_prod
_sparse_csr_sum _sparse_csr_tensor_unsafe _sparse_log_softmax _sparse_log_softmax_backward_data
_sparse_mask_projection _sparse_mm _sparse_mm_reduce_impl _sparse_mm_reduce_impl_backward
_sparse_semi_structured_addmm _sparse_semi_structured_apply _sparse_semi_structured_apply_dense
_sparse_semi_structured_linear _sparse_semi_structured_mm _sparse_semi_structured_tile
_sparse_softmax _sparse_softmax_backward_data _sparse_sparse_matmul _sparse_sum
_sparse_sum_backward _spdiags _spsolve _stack _standard_gamma _standard_gamma_grad
_tensor_to_list _test_ambiguous_defaults _test_autograd_multiple_dispatch
_test_autograd_multiple_dispatch_view _test_autograd_multiple_dispatch_view_copy
_test_check_tensor _test_functorch_fallback _test_optional_filled_intlist
_test_optional_floatlist _test_optional_intlist _test_parallel_materialize
_test_serialization_subcmul _test_string_default _test_warn_in_autograd
_thnn_differentiable_gru_cell_backward _thnn_differentiable_lstm_cell_backward
_thnn_fused_gru_cell _thnn_fused_gru_cell_backward _thnn_fused_lstm_cell
_thnn_fused_lstm_cell_backward _thnn_fused_lstm_cell_backward_impl _to_copy _to_cpu _to_dense
_to_sparse _to_sparse_bsc _to_sparse_bsr _to_sparse_csc _to_sparse_csr
_to_sparse_semi_structured _transform_bias_rescale_qkv _transformer_encoder_layer_fwd _trilinear
_triton_multi_head_attention _triton_scaled_dot_attention _unique _unique2 _unpack_dual
_unsafe_index _unsafe_index_put _unsafe_masked_index _unsafe_masked_index_put_accumulate
_unsafe_view _unwrap_optional _upsample_bicubic2d_aa _upsample_bicubic2d_aa_backward
_upsample_bilinear2d_aa _upsample_bilinear2d_aa_backward _upsample_lanczos2d_aa
_upsample_lanczos2d_aa_backward _upsample_nearest_exact1d _upsample_nearest_exact1d_backward
_upsample_nearest_exact2d _upsample_nearest_exact2d_backward _upsample_nearest_exact3d
_upsample_nearest_exact3d_backward _use_cudnn_ctc_loss _use_cudnn_rnn_flatten_weight
_use_miopen_ctc_loss _validate_compressed_sparse_indices _validate_sparse_bsc_tensor_args
_validate_sparse_bsr_tensor_args _validate_sparse_compressed_tensor_args
_validate_sparse_coo_tensor_args _validate_sparse_csc_tensor_args
_validate_sparse_csr_tensor_args _values _values_copy _version _weight_int4pack_mm
_weight_int4pack_mm_for_cpu _weight_int4pack_mm_with_scales_and_zeros _weight_int8pack_mm
_weight_norm _weight_norm_differentiable_backward _weight_norm_interface
_weight_norm_interface_backward _wrapped_linear_prepack _wrapped_quantized_linear_prepacked abs
abs_ absolute absolute_ acos acos_ acosh acosh_ adaptive_avg_pool1d adaptive_avg_pool2d
adaptive_avg_pool3d adaptive_avg_pool3d_backward adaptive_max_pool1d adaptive_max_pool2d
adaptive_max_pool2d_backward adaptive_max_pool3d adaptive_max_pool3d_backward add add_ addbmm
addbmm_ addcdiv addcdiv_ addcmul addcmul_ addmm addmm_ addmv addmv_ addr addr_ adjoint
affine_grid_generator affine_grid_generator_backward alias alias_copy all allclose alpha_dropout
alpha_dropout_ amax amin aminmax angle any append arange arccos arccos_ arccosh arccosh_ arcsin
arcsin_ arcsinh arcsinh_ arctan arctan2 arctan2_ arctan_ arctanh arctanh_ argmax argmin argsort
argwhere as_strided as_strided_ as_strided_copy as_strided_scatter as_tensor asin asin_ asinh
asinh_ atan atan2 atan2_ atan_ atanh atanh_ atleast_1d atleast_2d atleast_3d avg_pool1d
avg_pool2d avg_pool2d_backward avg_pool3d avg_pool3d_backward backward baddbmm baddbmm_
bartlett_window batch_norm batch_norm_backward batch_norm_backward_elemt
batch_norm_backward_reduce batch_norm_elemt batch_norm_gather_stats
batch_norm_gather_stats_with_counts batch_norm_stats batch_norm_update_stats bernoulli
bernoulli_ bilinear bin binary_cross_entropy binary_cross_entropy_backward
binary_cross_entropy_with_logits bincount binomial bitwise_and bitwise_and_ bitwise_left_shift
bitwise_left_shift_ bitwise_not bitwise_not_ bitwise_or bitwise_or_ bitwise_right_shift
bitwise_right_shift_ bitwise_xor bitwise_xor_ blackman_window block_diag bmm broadcast_shapes
broadcast_tensors broadcast_to bucketize can_cast capitalize cartesian_prod cat cauchy cauchy_
ccol_indices ccol_indices_copy cdist ceil ceil_ celu celu_ center chain_matmul chalf
channel_shuffle cholesky cholesky_inverse cholesky_solve choose_qparams_optimized chr chunk
clamp clamp_ clamp_max clamp_max_ clamp_min clamp_min_ clear clip clip_ clone coalesce col2im
col_indices col_indices_copy column_stack combinations complex concat concatenate
confirmed_by_owner conj conj_physical conj_physical_ constant_pad_nd contiguous conv1d conv2d
conv3d conv_depthwise3d conv_tbc conv_tbc_backward conv_transpose1d conv_transpose2d
conv_transpose3d convolution convolution_backward convolution_backward_overrideable
convolution_overrideable copy copy_ copy_sparse_to_sparse copy_sparse_to_sparse_ copysign
copysign_ corrcoef cos cos_ cosh cosh_ cosine_embedding_loss cosine_similarity count
count_nonzero cov cpu cross cross_entropy_loss crow_indices crow_indices_copy ctc_loss cuda
cudnn_affine_grid_generator cudnn_affine_grid_generator_backward cudnn_batch_norm
cudnn_batch_norm_backward cudnn_convolution cudnn_convolution_add_relu cudnn_convolution_relu
cudnn_convolution_transpose cudnn_grid_sampler cudnn_grid_sampler_backward cudnn_is_acceptable
cummax cummaxmin_backward cummin cumprod cumprod_ cumprod_backward cumsum cumsum_
cumulative_trapezoid data deg2rad deg2rad_ degrees dense_dim dequantize det detach detach_
detach_copy device diag diag_embed diagflat diagonal diagonal_backward diagonal_copy
diagonal_scatter dict diff digamma digamma_ dim dist dist_backward div div_ divide divide_
divmod dot dropout dropout_ dsplit dstack einsum element_size elu elu_ elu_backward embedding
embedding_backward embedding_bag embedding_dense_backward embedding_renorm embedding_renorm_
embedding_sparse_backward empty empty_like empty_permuted empty_quantized empty_strided endswith
eq eq_ equal erf erf_ erfc erfc_ erfinv erfinv_ exp exp2 exp2_ exp_ expand expand_as expand_copy
expandtabs expm1 expm1_ exponential exponential_ extend eye fabs factorial
fake_quantize_per_channel_affine fake_quantize_per_channel_affine_cachemask
fake_quantize_per_channel_affine_cachemask_backward fake_quantize_per_tensor_affine
fake_quantize_per_tensor_affine_cachemask fake_quantize_per_tensor_affine_cachemask_backward
fbgemm_linear_fp16_weight fbgemm_linear_fp16_weight_fp32_activation fbgemm_linear_int8_weight
fbgemm_linear_int8_weight_fp32_activation fbgemm_linear_quantize_weight
fbgemm_pack_gemm_matrix_fp16 fbgemm_pack_quantized_matrix feature_alpha_dropout
feature_alpha_dropout_ feature_dropout feature_dropout_ fft_fft fft_fft2 fft_fftfreq fft_fftn
fft_fftshift fft_hfft fft_hfft2 fft_hfftn fft_ifft fft_ifft2 fft_ifftn fft_ifftshift fft_ihfft
fft_ihfft2 fft_ihfftn fft_irfft fft_irfft2 fft_irfftn fft_rfft fft_rfft2 fft_rfftfreq fft_rfftn
fill fill_ fill_diagonal_ find fix fix_ flatten flatten_dense_tensors flip fliplr flipud
float_power float_power_ floor floor_ floor_divide floor_divide_ floordiv fmax fmin fmod fmod_
format frac frac_ fractional_max_pool2d fractional_max_pool2d_backward fractional_max_pool3d
fractional_max_pool3d_backward frexp frobenius_norm from_file full full_like
fused_moving_avg_obs_fake_quant gamma gather gather_backward gcd gcd_ ge ge_ gelu gelu_
gelu_backward geometric geometric_ geqrf ger get get_autocast_dtype get_device get_gradients glu
glu_backward glu_backward_jvp glu_jvp grad gradient greater greater_ greater_equal
greater_equal_ grid_sampler grid_sampler_2d grid_sampler_2d_backward grid_sampler_3d
grid_sampler_3d_backward group_norm gru gru_cell gt gt_ hamming_window hann_window hardshrink
hardshrink_backward hardsigmoid hardsigmoid_ hardsigmoid_backward hardswish hardswish_
hardswish_backward hardtanh hardtanh_ hardtanh_backward has_torch_function hash hash_tensor
heaviside heaviside_ hex hinge_embedding_loss histc histogram histogramdd hsplit hspmm hstack
huber_loss huber_loss_backward hypot hypot_ i0 i0_ igamma igamma_ igammac igammac_ im2col imag
index index_add index_add_ index_copy index_copy_ index_fill index_fill_ index_put index_put_
index_reduce index_reduce_ index_select index_select_backward indices indices_copy
infinitely_differentiable_gelu_backward initial_seed inner insert instance_norm int_repr inverse
is_autocast_cpu_enabled is_autocast_enabled is_coalesced is_complex is_conj is_contiguous
is_distributed is_floating_point is_grad_enabled is_inference is_leaf is_neg
is_non_overlapping_and_dense is_nonzero is_owner is_pinned is_same_size is_scripting is_set_to
is_signed is_strides_like_format is_vulkan_available isalnum isalpha isclose isdecimal isdigit
isfinite isidentifier isin isinf islower isnan isneginf isnumeric isposinf isprintable isreal
isspace istft istitle isupper item items join kaiser_window keys kl_div kron kthvalue l1_loss
layer_norm lcm lcm_ ldexp ldexp_ le le_ leaky_relu leaky_relu_ leaky_relu_backward len lerp
lerp_ less less_ less_equal less_equal_ lgamma lgamma_ lift lift_fresh lift_fresh_copy
linalg__powsum linalg_cholesky linalg_cholesky_ex linalg_cond linalg_cross linalg_det
linalg_diagonal linalg_eig linalg_eigh linalg_eigvals linalg_eigvalsh linalg_householder_product
linalg_inv linalg_inv_ex linalg_ldl_factor linalg_ldl_factor_ex linalg_ldl_solve linalg_lstsq
linalg_lu linalg_lu_factor linalg_lu_factor_ex linalg_lu_solve linalg_matmul linalg_matrix_exp
linalg_matrix_norm linalg_matrix_power linalg_matrix_rank linalg_matrix_sqrth linalg_multi_dot
linalg_norm linalg_pinv linalg_polar linalg_qr linalg_slogdet linalg_solve linalg_solve_ex
linalg_solve_triangular linalg_svd linalg_svdvals linalg_tensorinv linalg_tensorsolve
linalg_vander linalg_vecdot linalg_vector_norm linear linear_backward linspace list ljust
local_value log log10 log10_ log1p log1p_ log2 log2_ log_ log_normal log_normal_ log_sigmoid
log_sigmoid_backward log_sigmoid_forward log_softmax logaddexp logaddexp2 logcumsumexp logdet
logical_and logical_and_ logical_not logical_not_ logical_or logical_or_ logical_xor
logical_xor_ logit logit_ logit_backward logspace logsumexp lower lstm lstm_cell
lstm_mps_backward lstrip lt lt_ lu_solve lu_unpack mH mT manual_seed margin_ranking_loss
masked_fill masked_fill_ masked_scatter masked_scatter_ masked_scatter_backward masked_select
masked_select_backward mathremainder matmul matmul_backward matrix_H matrix_exp
matrix_exp_backward matrix_power max max_pool1d max_pool1d_with_indices max_pool2d
max_pool2d_backward max_pool2d_with_indices max_pool2d_with_indices_backward max_pool3d
max_pool3d_with_indices max_pool3d_with_indices_backward max_unpool2d max_unpool3d maximum mean
median meshgrid min minimum miopen_batch_norm miopen_batch_norm_backward miopen_convolution
miopen_convolution_add_relu miopen_convolution_relu miopen_convolution_transpose miopen_ctc_loss
miopen_depthwise_convolution miopen_rnn miopen_rnn_backward mish mish_ mish_backward
mkldnn_adaptive_avg_pool2d mkldnn_adaptive_avg_pool2d_backward mkldnn_convolution mkldnn_linear
mkldnn_linear_backward mkldnn_linear_backward_input mkldnn_linear_backward_weights
mkldnn_max_pool2d mkldnn_max_pool2d_backward mkldnn_max_pool3d mkldnn_max_pool3d_backward
mkldnn_reorder_conv2d_weight mkldnn_reorder_conv3d_weight mkldnn_rnn_layer
mkldnn_rnn_layer_backward mm mode modf moveaxis movedim mps_convolution_backward
mps_convolution_transpose_backward mse_loss mse_loss_backward msort mul mul_ multi_margin_loss
multi_margin_loss_backward multilabel_margin_loss multilabel_margin_loss_backward
multilabel_margin_loss_forward multinomial multiply multiply_ mv mvlgamma mvlgamma_ nan_to_num
nan_to_num_ nanmean nanmedian nanquantile nansum narrow narrow_copy native_batch_norm
native_batch_norm_backward native_channel_shuffle native_dropout native_dropout_backward
native_group_norm native_group_norm_backward native_layer_norm native_layer_norm_backward
native_norm ne ne_ neg neg_ negative negative_ nested_to_padded_tensor new_empty
new_empty_strided new_full new_ones new_zeros nextafter nextafter_ nll_loss nll_loss2d
nll_loss2d_backward nll_loss2d_forward nll_loss_backward nll_loss_forward nll_loss_nd nonzero
nonzero_numpy nonzero_static norm norm_except_dim normal normal_ normal_functional not_equal
not_equal_ nuclear_norm numel numpy_T oct one_hot ones ones_like ord orgqr ormqr outer output_nr
owner owner_name pad pad_sequence pairwise_distance partition pdist percentFormat permute
permute_copy pin_memory pinverse pixel_shuffle pixel_unshuffle poisson poisson_nll_loss polar
polygamma polygamma_ pop popitem positive pow pow_ prelu prod promote_types put put_
q_per_channel_axis q_per_channel_scales q_per_channel_zero_points q_scale q_zero_point qr
qscheme quantile quantize_per_channel quantize_per_tensor quantize_per_tensor_dynamic
quantized_batch_norm quantized_gru quantized_gru_cell quantized_lstm quantized_lstm_cell
quantized_max_pool1d quantized_max_pool2d quantized_max_pool3d quantized_rnn_relu_cell
quantized_rnn_tanh_cell rad2deg rad2deg_ radians rand rand_like randint randint_like randn
randn_like random random_ randperm range ravel real reciprocal reciprocal_ record_stream
reflection_pad1d reflection_pad1d_backward reflection_pad2d reflection_pad2d_backward
reflection_pad3d reflection_pad3d_backward relu relu6 relu6_ relu_ remainder remainder_ remove
renorm renorm_ repeat repeat_interleave replace replication_pad1d replication_pad1d_backward
replication_pad2d replication_pad2d_backward replication_pad3d replication_pad3d_backward
requires_grad_ reshape reshape_as resize resize_ resize_as resize_as_ resize_as_sparse
resize_as_sparse_ resolve_conj resolve_neg result_type retain_grad retains_grad reverse rfind
rindex rjust rms_norm rnn_relu rnn_relu_cell rnn_tanh rnn_tanh_cell roll rot90 round round_
row_indices row_indices_copy row_stack rpartition rrelu rrelu_ rrelu_with_noise
rrelu_with_noise_ rrelu_with_noise_backward rrelu_with_noise_functional rsplit rsqrt rsqrt_
rstrip rsub save scalar_tensor scaled_dot_product_attention scatter scatter_ scatter_add
scatter_add_ scatter_reduce scatter_reduce_ searchsorted seed segment_reduce select
select_backward select_copy select_scatter selu selu_ set set_ set_data set_grad_enabled
setdefault sgn sgn_ shallow_copy_data_ sigmoid sigmoid_ sigmoid_backward sign sign_ signbit silu
silu_ silu_backward sin sin_ sinc sinc_ sinh sinh_ size slice slice_backward slice_copy
slice_inverse slice_scatter slogdet slow_conv3d slow_conv3d_forward slow_conv_dilated2d
slow_conv_dilated3d slow_conv_transpose2d slow_conv_transpose3d smm smooth_l1_loss
smooth_l1_loss_backward soft_margin_loss soft_margin_loss_backward softmax softplus
softplus_backward softshrink softshrink_backward sort sorted sparse_bsc_tensor sparse_bsr_tensor
sparse_compressed_tensor sparse_coo_tensor sparse_csc_tensor sparse_csr_tensor sparse_dim
sparse_mask sparse_resize sparse_resize_ sparse_resize_and_clear sparse_resize_and_clear_
sparse_sampled_addmm special_airy_ai special_bessel_j0 special_bessel_j1 special_bessel_y0
special_bessel_y1 special_chebyshev_polynomial_t special_chebyshev_polynomial_u
special_chebyshev_polynomial_v special_chebyshev_polynomial_w special_digamma special_entr
special_erf special_erfc special_erfcx special_erfinv special_exp2 special_expit special_expm1
special_gammainc special_gammaincc special_gammaln special_hermite_polynomial_h
special_hermite_polynomial_he special_i0 special_i0e special_i1 special_i1e
special_laguerre_polynomial_l special_legendre_polynomial_p special_log1p special_log_ndtr
special_log_softmax special_logit special_logsumexp special_modified_bessel_i0
special_modified_bessel_i1 special_modified_bessel_k0 special_modified_bessel_k1
special_multigammaln special_ndtr special_ndtri special_polygamma special_psi special_round
special_scaled_modified_bessel_k0 special_scaled_modified_bessel_k1
special_shifted_chebyshev_polynomial_t special_shifted_chebyshev_polynomial_u
special_shifted_chebyshev_polynomial_v special_shifted_chebyshev_polynomial_w special_sinc
special_softmax special_spherical_bessel_j0 special_xlog1py special_xlogy special_zeta split
split_copy split_with_sizes split_with_sizes_copy splitlines sqrt sqrt_ square square_ squeeze
squeeze_ squeeze_copy sspaddmm stack startswith std std_mean stft storage_offset str stride
strip sub sub_ subtract subtract_ sum sum_to_size svd swapaxes swapaxes_ swapcase swapdims
swapdims_ sym_constrain_range sym_constrain_range_for_size sym_is_contiguous sym_numel sym_size
sym_storage_offset sym_stride t t_ t_copy take take_along_dim tan tan_ tanh tanh_ tanh_backward
tensor tensor_split tensordot thnn_conv2d threshold threshold_ threshold_backward tile title to
to_dense to_dense_backward to_here to_mkldnn to_mkldnn_backward to_padded_tensor to_sparse
to_sparse_bsc to_sparse_bsr to_sparse_csc to_sparse_csr topk trace trace_backward transpose
transpose_ transpose_copy trapezoid trapz triangular_solve tril tril_ tril_indices
triplet_margin_loss triu triu_ triu_indices true_divide true_divide_ trunc trunc_ type_as unbind
unbind_copy unflatten unflatten_dense_tensors unfold unfold_backward unfold_copy uniform
uniform_ unique_consecutive unique_dim unique_dim_consecutive unsafe_chunk unsafe_split
unsafe_split_with_sizes unsqueeze unsqueeze_ unsqueeze_copy update upper upsample_bicubic2d
upsample_bicubic2d_backward upsample_bilinear2d upsample_bilinear2d_backward upsample_linear1d
upsample_linear1d_backward upsample_nearest1d upsample_nearest1d_backward upsample_nearest2d
upsample_nearest2d_backward upsample_nearest3d upsample_nearest3d_backward upsample_trilinear3d
upsample_trilinear3d_backward value_selecting_reduction_backward values values_copy vander var
var_mean vdot view view_as view_as_complex view_as_complex_copy view_as_real view_as_real_copy
view_copy vsplit vstack wait warn where xlogy xlogy_ zero zero_ zeros zeros_like zfill
"""
)

_PRIM_OPS = _names(
    """
AddStatValue AutogradAdd AutogradAllNonZero AutogradAllZero AutogradAnyNonZero AutogradZero
BailOut BailoutTemplate BroadcastMKLDNNTensors BroadcastSizes ChunkSizes ConstantChunk
ConstantMKLDNNTensor DifferentiableGraph EnumName EnumValue FallbackGraph FusedConcat
FusionGroup Guard IfThenElse IgnoredPythonOp MKLDNNClamp MKLDNNClamp_ MKLDNNHardSigmoid
MKLDNNHardSigmoid_ MKLDNNHardSwish MKLDNNHardSwish_ MKLDNNHardTanh MKLDNNHardTanh_
MKLDNNLayerNorm MKLDNNLayerNorm_ MKLDNNScalarMul MKLDNNScalarMul_ MMBatchSide MMTreeReduce
ModuleContainerIndex NumToTensor Print PythonOp RaiseException ReductionSizes RequiresGradCheck
StaticRuntimeCopyOuts StaticSubgraph StringIndex TensorExprDynamicGroup TensorExprDynamicGuard
TensorExprGroup TimePoint TupleIndex TupleUnpack TypeCheck Uninitialized VarConcat VarStack abs
awaitable_nowait awaitable_wait data device dtype grad id index is_cpu is_cuda is_ipu is_maia
is_meta is_mkldnn is_mps is_mtia is_nested is_quantized is_sparse is_sparse_csr is_vulkan is_xla
is_xpu itemsize layout max min mkldnn_convolution name nbytes oneDNNFusionGroup
oneDNNFusionGuard profile profile_ivalue rangelist requires_grad rpc_async rpc_remote rpc_sync
tolist type unchecked_cast unchecked_unwrap_optional
"""
)

_QUANTIZED_OPS = _names(
    """
add add_out add_relu add_relu_out add_scalar add_scalar_out add_scalar_relu add_scalar_relu_out
batch_norm batch_norm1d batch_norm1d_relu batch_norm2d batch_norm2d_relu batch_norm3d
batch_norm3d_relu batch_norm_relu cat cat_out cat_relu cat_relu_out celu clamp conv1d
conv1d_dynamic conv1d_prepack conv1d_relu conv1d_unpack conv2d conv2d_add conv2d_add_relu
conv2d_dilation conv2d_dynamic conv2d_groups conv2d_output_padding conv2d_padding conv2d_prepack
conv2d_relu conv2d_stride conv2d_transpose conv2d_unpack conv2d_unpack_sizes conv3d
conv3d_dilation conv3d_dynamic conv3d_groups conv3d_output_padding conv3d_padding conv3d_prepack
conv3d_relu conv3d_stride conv3d_transpose conv3d_unpack conv_prepack conv_transpose1d
conv_transpose1d_dynamic conv_transpose1d_prepack conv_transpose1d_unpack conv_transpose2d
conv_transpose2d_dilation conv_transpose2d_dynamic conv_transpose2d_groups
conv_transpose2d_output_padding conv_transpose2d_padding conv_transpose2d_prepack
conv_transpose2d_stride conv_transpose2d_transpose conv_transpose2d_unpack conv_transpose3d
conv_transpose3d_dilation conv_transpose3d_dynamic conv_transpose3d_groups
conv_transpose3d_output_padding conv_transpose3d_padding conv_transpose3d_prepack
conv_transpose3d_stride conv_transpose3d_transpose conv_transpose3d_unpack conv_unpack dropout
elu embedding_4bit embedding_bag_2bit_prepack embedding_bag_2bit_prepack_with_rowwise_min_max
embedding_bag_2bit_rowwise_offsets embedding_bag_2bit_unpack embedding_bag_4bit
embedding_bag_4bit_prepack embedding_bag_4bit_prepack_with_rowwise_min_max
embedding_bag_4bit_rowwise_offsets embedding_bag_4bit_unpack embedding_bag_byte
embedding_bag_byte_prepack embedding_bag_byte_prepack_with_rowwise_min_max
embedding_bag_byte_rowwise_offsets embedding_bag_byte_unpack embedding_bag_prepack
embedding_bag_unpack embedding_byte group_norm hardswish instance_norm int4mm_packed_weight_cpu
layer_norm leaky_relu linear linear_dynamic linear_dynamic_fp16
linear_dynamic_fp16_unpacked_weight linear_leaky_relu linear_prepack linear_prepack_fp16
linear_prepack_fp16_legacy linear_prepack_legacy linear_relu linear_relu_dynamic
linear_relu_dynamic_fp16 linear_tanh linear_unpack linear_unpack_fp16
linear_with_input_q_dq_qweight_dq_output_fp32 linear_with_input_q_dq_qweight_dq_relu_output_fp32
make_quantized_cell_params make_quantized_cell_params_dynamic make_quantized_cell_params_fp16
matmul max_pool1d max_pool2d mul mul_out mul_relu mul_relu_out mul_scalar mul_scalar_out
mul_scalar_relu mul_scalar_relu_out prelu quantized_gru_cell_dynamic quantized_lstm_cell_dynamic
quantized_rnn_relu_cell_dynamic quantized_rnn_tanh_cell_dynamic relu6 sigmoid softmax threshold
"""
)
# TorchScript-defined builtins (frontend/builtin_functions.cpp), not in the schema registry.
_ATEN_BUILTINS = frozenset({"_single", "_pair", "_triple", "_quadruple"})
_PRIM_BUILTINS = frozenset({"ndim", "T", "mT", "H", "mH"})

_OPS: dict[str, frozenset[str]] = {
    "aten": _ATEN_OPS | _ATEN_BUILTINS,
    "prim": _PRIM_OPS | _PRIM_BUILTINS,
    "quantized": _QUANTIZED_OPS,
    "profiler": _PROFILER_OPS,
}
