"""Inductor's hooks: compiling and loading AOTInductor packages, and its generated input checks.

- ``aoti_compile``: ``torch._inductor.aoti_compile_and_package`` (torch's AOTI entry point).
- ``aoti_load_package``: ``torch._inductor.aoti_load_package`` and the loaded runner's private
  ``loader.get_call_spec()`` (the input names a package was exported with).
- ``aoti_input_checks``: replaces ``CppWrapperCpu.generate_input_output_runtime_checks`` so the
  caller can edit the C++ lines it writes (``self.prefix._lines``) given the graph's inputs
  (``V.graph.graph_inputs``), with the dims ``floor_of_one`` names bounded at 1 instead of 2
  while they are written (the shape environment's ``var_to_range``, ``ValueRanges``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ptconvert._compat.registry import TORCH_TESTED, Hook, available, declare, options

COMPILE = "aoti_compile"
LOAD = "aoti_load_package"
CHECKS = "aoti_input_checks"
# the generated ``__check_inputs_outputs`` starts with this early return (torch 2.13–2.14)
ENV_GATE = ("if (!_check_aoti_runtime_check_inputs_env()){", "return;", "}")


def compile_and_package(ep: Any, **kwargs: Any) -> Any:
    """``torch._inductor.aoti_compile_and_package(ep, **kwargs)``."""
    available(COMPILE)
    import torch._inductor

    return torch._inductor.aoti_compile_and_package(ep, **kwargs)


def load_package(path: str) -> tuple[Any, Any]:
    """The package's runner and its input treespec (args, kwargs), as it was exported."""
    available(LOAD)
    import torch._inductor
    from torch.utils import _pytree

    runner = torch._inductor.aoti_load_package(path)
    return runner, _pytree.treespec_loads(runner.loader.get_call_spec()[0])


def _probe_load() -> bool:
    import torch._inductor
    from torch.export.pt2_archive._package import AOTICompiledModel
    from torch.utils import _pytree

    source = inspect.getsource(AOTICompiledModel)
    return (
        callable(getattr(torch._inductor, "aoti_load_package", None))
        and hasattr(_pytree, "treespec_loads")
        and "self.loader.get_call_spec()" in source
    )


def _probe_checks() -> bool:
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    from torch._inductor.utils import IndentedBuffer
    from torch._inductor.virtualized import V
    from torch.utils._sympy.value_ranges import ValueRanges

    source = inspect.getsource(CppWrapperCpu.generate_input_output_runtime_checks)
    gate = "".join("".join(ENV_GATE).split())
    return (
        hasattr(V, "graph")
        and callable(ValueRanges)
        and gate in "".join(source.split())
        and "self._lines" in inspect.getsource(IndentedBuffer.__init__)
    )


@contextmanager
def _floor_of_one(dims: frozenset[tuple[int, int]]) -> Iterator[None]:
    """The checks' lower bound of these dims' symbols at 1 while the checks are written: the
    bound is read from the shape environment's value ranges, restored after."""
    import sympy
    from torch._inductor.virtualized import V
    from torch.utils._sympy.value_ranges import ValueRanges

    env = V.graph.sizevars.shape_env
    inputs = list(V.graph.graph_inputs.values())
    saved: dict[Any, Any] = {}
    for index, axis in dims:
        size: Any = getattr(inputs[index], "get_size", tuple)() if index < len(inputs) else ()
        symbol = size[axis] if axis < len(size) else None
        if isinstance(symbol, sympy.Symbol) and symbol in env.var_to_range:
            saved[symbol] = env.var_to_range[symbol]
            env.var_to_range[symbol] = ValueRanges(1, saved[symbol].upper)
    try:
        yield
    finally:
        env.var_to_range.update(saved)


def _apply_checks() -> Callable[[], None]:
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu

    original = CppWrapperCpu.generate_input_output_runtime_checks

    def generate(self: Any) -> None:
        from torch._inductor.virtualized import V

        opts = options(CHECKS)
        if opts is None:  # a thread outside the patch: torch's own
            return original(self)
        with _floor_of_one(opts.get("floor_of_one", frozenset())):
            original(self)
        edit = opts.get("edit")
        if edit is not None:
            edit(self.prefix._lines, list(V.graph.graph_inputs.values()))

    CppWrapperCpu.generate_input_output_runtime_checks = generate  # type: ignore[method-assign]

    def undo() -> None:
        CppWrapperCpu.generate_input_output_runtime_checks = original  # type: ignore[method-assign]

    return undo


def _probe_compile() -> bool:
    import torch._inductor

    return callable(getattr(torch._inductor, "aoti_compile_and_package", None))


declare(
    Hook(
        name=COMPILE,
        what="calls torch._inductor.aoti_compile_and_package (the aoti edge)",
        package="torch",
        tested=TORCH_TESTED,
        probe=_probe_compile,
        fallback=None,
    )
)
declare(
    Hook(
        name=LOAD,
        what="calls torch._inductor.aoti_load_package and reads the runner's "
        "loader.get_call_spec() (running an AOTInductor package)",
        package="torch",
        tested=TORCH_TESTED,
        probe=_probe_load,
        fallback=None,
    )
)
declare(
    Hook(
        name=CHECKS,
        what="patches torch._inductor.codegen.cpp_wrapper_cpu.CppWrapperCpu."
        "generate_input_output_runtime_checks; edits its C++ lines (prefix._lines) and "
        "V.graph's shape_env.var_to_range (a package checks its inputs on every call)",
        package="torch",
        tested=TORCH_TESTED,
        probe=_probe_checks,
        fallback=None,  # a package that silently goes unchecked is never written
        apply=_apply_checks,
    )
)
