"""Judge the TorchScript source members (``code/**.py``) of a ``torch.jit.save`` archive.

``torch.jit.load`` compiles these members and runs any ``__setstate__`` they define while it
unpickles ``data.pkl``, so an archive whose pickles are clean can still create files (e.g.
``torch.from_file(path, shared=True, size=n)`` or ``torch.save``) the moment it is loaded, and
``forward`` code runs when ptconvert verifies a conversion. Nothing here imports torch or runs the
code: each member is parsed with :mod:`ast` and every name it resolves is judged the way the
TorchScript importer resolves it (``torch.X`` and ``torch.autograd.X`` are ``aten::X``,
``ops.NS.X`` is ``NS::X``, ``getattr(obj, "X")`` is ``obj.X``, ``__torch__.*`` is code of the
archive itself or a torchbind class under ``__torch__.torch.classes``).

Code that runs at load time, before anybody asked for the model to run, is held to stricter
rules: ``__setstate__`` (and the methods of its own class it calls), default argument values (the
importer evaluates them when it compiles a method) and class-body values may only assign
attributes of ``self`` and call allowlisted operators and pure builtins. Names, statements and
expressions TorchScript never writes are refused. What a global name resolves to is judged in
``ts_names.py``, an operator by the policy of ``code_policy.py``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace

from ptconvert.scan.code_policy import DANGEROUS, ERROR, CodeFinding, denial, name_set, op_problem
from ptconvert.scan.ts_names import BUILTINS, global_problem

_BASES = frozenset({"Module", "NamedTuple", "Interface", "ModuleInterface", "Enum"})
# Names the printer never binds locally (it renames such variables ops0, getattr0, ...).
_RESERVED = name_set(
    "torch ops CONSTANTS __torch__ fork awaitable getattr inf nan uninitialized unchecked_cast"
)
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
            if root.id in {"torch", "ops"} or (root.id in BUILTINS and not attrs):
                return  # operators were judged by _reference; builtins are pure
            self._flag(func, name, "calls something other than a tensor op", ctx)
        elif isinstance(root, ast.Name) and root.id == ctx.self_name and len(attrs) == 1:
            # self.m(...) only: getattr(self, "m") would escape _load_time_methods' reach
            if attrs[0] not in ctx.methods or link is not None:
                self._flag(func, name, "calls something other than a method of its class", ctx)
        elif attrs and link is None and op_problem("aten", attrs[-1]) is None:
            return  # a tensor/list/str method, i.e. an aten operator on that value
        elif attrs and link is None and op_problem("prim", attrs[-1]) is None:
            return
        else:
            self._flag(func, name, "calls a method of another object or a local value", ctx)

    def _reference(self, node: ast.expr, ctx: _Context) -> None:
        """Judge a name or an attribute chain as the importer resolves it."""
        root, attrs = _chain(node, ctx)
        name = _render(root, attrs)
        if isinstance(root, ast.Name) and root.id not in ctx.local:
            problem = global_problem(root.id, attrs)
            if problem is not None:
                self._flag(node, name, problem, ctx)
        elif not isinstance(root, ast.Name):
            self._expr(root, ctx)
        for attr in attrs:  # x.save(...), getattr(x, "from_file"): refused on any value
            denied = denial(attr)
            if denied is not None:
                self._flag(node, name, f"{attr!r} {denied}", ctx)


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
