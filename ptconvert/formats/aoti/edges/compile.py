"""The exported → aoti edge: Inductor's ``aoti_compile_and_package`` into a ``.pt2`` package.

The package holds a shared library compiled for one device (``--device``), with the program's
dynamic dims kept; ``--aoti-option k=v`` passes Inductor configs (``max_autotune=1``). Compiling
takes tens of seconds even for a small model: the time is reported.

The package checks its inputs on every call. Inductor writes per-input checks (dtype, static sizes
and strides, the dynamic dims' bounds, device) into the generated C++, but runs them only when the
*calling* process sets ``AOTI_RUNTIME_CHECK_INPUTS``: a user who loads the package without it gets
wrong numbers at a size it was not compiled for. ``checked_inputs`` drops that condition while
ptconvert compiles (Inductor's internal ``assert_size_stride`` checks stay as they are; the hook
``aoti_input_checks`` of ptconvert/_compat). A dynamic dim whose minimum is torch's floor of 2 takes
size 1 too (as a ``.pt2`` does, and the range check runs it there), unless verification bounded it
(``state.bounds``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ptconvert import _compat
from ptconvert._compat import inductor
from ptconvert.convert.state import Bounds, RunState
from ptconvert.errors import UnsupportedConversionError, named_error
from ptconvert.formats.aoti.options import AotiOptions
from ptconvert.formats.aoti.runtime import INPUT_NAMES
from ptconvert.options import Options
from ptconvert.quiet import quiet_torch
from ptconvert.verify.check import require_device

_ENV_GATE = inductor.ENV_GATE  # the generated checks' early return (torch 2.13–2.14)


def aoti_compile(state: RunState, opts: Options) -> None:
    assert state.exported is not None and state.output is not None
    require_device(opts.device)
    try:
        _compile(state, opts)
    except UnsupportedConversionError as exc:
        if not state.family_axes or state.module is None or state.inputs is None:
            raise
        # axes made dynamic by default, not asked for (SegFormer's height and width: Inductor
        # cannot lower its strided conv over them): the program again with them fixed
        from dataclasses import replace

        from ptconvert.convert.exporting import AXES_NOTE, export_module

        fixed = ", ".join(a.name for a in state.family_axes)
        static = replace(opts, static_sequence=True)
        # the first program's word on its axes no longer holds
        state.notes = [n for n in state.notes if not n.startswith(AXES_NOTE)]
        state.exported = export_module(state, static, state.inputs)
        _compile(state, opts)
        state.notes.append(
            f"{fixed} could not stay dynamic in the package ({exc.message[:200]}): exported "
            "again at the example's sizes for them (the package refuses others)"
        )


def _compile(state: RunState, opts: Options) -> None:
    from ptconvert.verify.dims import user_inputs

    assert state.exported is not None and state.output is not None
    ep: Any = state.exported
    _refuse_baked_scalars(ep, state)
    ones = accepted_at_one(ep, state.bounds)
    if opts.device != "cpu":
        from torch.export.passes import move_to_device_pass

        ep = move_to_device_pass(ep, opts.device)
    # under the output's own name (the archive's folder is named after the file; torch wants
    # .pt2), in a folder beside it, then moved onto the temporary output
    final = (state.destination or state.output).name
    folder = Path(tempfile.mkdtemp(prefix=".aoti.", dir=state.output.parent))
    package = folder / (final if final.endswith(".pt2") else f"{final}.pt2")
    for hook in (inductor.COMPILE, inductor.CHECKS):  # a torch without them: CompatError
        _compat.available(hook)
    started = time.perf_counter()
    try:
        with quiet_torch(), checked_inputs(ones, [n for n, _ in user_inputs(ep)]):
            inductor.compile_and_package(
                ep, package_path=str(package), inductor_configs=named_inputs(ep, opts)
            )
        os.replace(package, state.output)
    except OSError as exc:  # the filesystem (no space, read-only …): said as such, exit 9
        raise named_error(exc, state.destination or state.output) or exc from None
    except Exception as exc:  # Inductor's errors are long: the first line says what failed
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise UnsupportedConversionError(
            f"AOTInductor cannot compile this program: {type(exc).__name__}: {first}",
            path=state.src,
        ) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    options = ", ".join(f"{k}={v}" for k, v in opts.of(AotiOptions).aoti_options.items())
    state.notes.append(
        f"AOTInductor compiled for {opts.device} in {time.perf_counter() - started:.1f} s"
        + (f" ({options})" if options else "")
        + "; the package holds native code: loading it runs a compiled shared library"
    )
    state.notes.append(
        "the package checks every call's input dtypes, shapes and strides itself, "
        "AOTI_RUNTIME_CHECK_INPUTS set or not: a size outside what was verified raises"
    )


# g++ -g1: the library's DWARF line tables, which name every source and header by the absolute
# path it was compiled from (this machine's venv and Inductor cache); two thirds of a small
# package's bytes. Left out unless --keep-debug-info (or --aoti-option sets it). What stays:
# the generated .cpp files end with the compile command as a comment, and the library holds
# the headers' __FILE__ names: paths still, a few dozen (docs/outputs.md).
LINE_TABLES = "aot_inductor.enable_line_tables"
METADATA = "aot_inductor.metadata"  # strings the package keeps, read back by get_metadata()


def inductor_configs(opts: Options) -> dict[str, Any]:
    """Inductor's configs for the compile: ``--aoti-option`` values, line tables off by default."""
    configs = dict(opts.of(AotiOptions).aoti_options)
    if not opts.keep_debug_info:
        configs.setdefault(LINE_TABLES, False)
    return configs


def named_inputs(ep: Any, opts: Options) -> dict[str, Any]:
    """The compile's configs with forward's positional input names in the package's metadata
    (``runtime.INPUT_NAMES``): its call spec counts them but does not name them."""
    configs = inductor_configs(opts)
    signature = ep.module_call_graph[0].signature if ep.module_call_graph else None
    names = list(getattr(signature, "forward_arg_names", None) or [])
    spec = ep.call_spec.in_spec
    count = spec.children()[0].num_children if spec is not None and spec.num_children else 0
    if count and len(names) >= count:
        metadata = dict(configs.get(METADATA) or {})
        metadata.setdefault(INPUT_NAMES, ",".join(names[:count]))
        configs[METADATA] = metadata
    return configs


def baked_scalars(ep: Any) -> dict[str, Any]:
    """The user inputs torch.export took as constants (a Python int, float, bool or string;
    None is structure, not a value), by forward's names."""
    specs = [s for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    signature = ep.module_call_graph[0].signature if ep.module_call_graph else None
    names = list(getattr(signature, "forward_arg_names", None) or [])
    if len(names) != len(specs):
        names = [s.arg.name for s in specs]
    return {
        name: spec.arg.value
        for name, spec in zip(names, specs, strict=True)
        if type(spec.arg).__name__ == "ConstantArgument" and spec.arg.value is not None
    }


def _refuse_baked_scalars(ep: Any, state: RunState) -> None:
    """A package's runner (``aoti_load_package``) passes tensors only to the compiled code and
    drops every other argument: a scalar input is the example's value in the package, and a
    call with another value returns the example's numbers without a word. A ``.pt2`` guards it."""
    scalars = baked_scalars(ep)
    if scalars:
        given = ", ".join(f"{n}={v!r}" for n, v in scalars.items())
        raise UnsupportedConversionError(
            f"the model takes non-tensor inputs ({given}): an AOTInductor package computes with "
            "the example's values and its runner drops the arguments it is called with, so a "
            "call with another value would return wrong numbers",
            path=state.src,
            hint="convert to pt2 (its guard refuses another value) or torchscript (takes any), "
            "or make the input a tensor (--input NAME::DTYPE → a 0-d tensor in the factory)",
        )


def accepted_at_one(ep: Any, bounds: Bounds) -> frozenset[tuple[int, int]]:
    """(input index, axis) of the dynamic dims the package takes at size 1: those the range
    check runs there (a minimum of 2, torch's floor), unless verification bounded them, and
    plain dims the program declares from 1 (``Dim(min=1)``: a generation export's new tokens;
    Inductor's checks would put torch's floor of 2 on them)."""
    from ptconvert.verify.dims import dynamic_dims, user_inputs
    from ptconvert.verify.probes import probed_at_one

    index = {name: i for i, (name, _val) in enumerate(user_inputs(ep))}
    every = dynamic_dims(ep)
    dims = probed_at_one(every)
    dims += [d for d in every if (d.scale, d.offset) == (1, 0) and d.symbol_min == 1]
    return frozenset((index[d.input], d.axis) for d in dims if d.key not in bounds)


@contextmanager
def checked_inputs(
    accept_one: frozenset[tuple[int, int]] = frozenset(), names: list[str] | None = None
) -> Iterator[None]:
    """While it lasts, Inductor's AOT input checks run on every call of the packages it
    compiles (not only under ``AOTI_RUNTIME_CHECK_INPUTS``); the dims ``accept_one`` (input
    index, axis) have a lower bound of 1 in them instead of torch's 2; and inputs that share a
    size (``input_ids`` and ``attention_mask``: one batch, one length) must agree on it, which
    Inductor checks nowhere (a mask of another length was read as if it fit)."""

    def edit(lines: list[Any], inputs: list[Any]) -> None:
        _ungate(lines)
        _check_shared_dims(lines, inputs, names)

    with _compat.patched(inductor.CHECKS, floor_of_one=accept_one, edit=edit):
        yield


def _ungate(lines: list[Any]) -> None:
    """Remove the early return on an unset AOTI_RUNTIME_CHECK_INPUTS; a torch whose code
    differs is an error, never a package that silently goes unchecked."""
    text = [line.strip() if isinstance(line, str) else None for line in lines]
    starts = [i for i in range(len(text)) if tuple(text[i : i + 3]) == _ENV_GATE]
    if len(starts) != 1:
        raise RuntimeError(
            "this torch's AOTInductor writes its input checks differently: ptconvert cannot "
            "make them run on every call"
        )
    at = starts[0]
    lines[at : at + 3] = ["// ptconvert: the inputs are checked on every call"]


def _check_shared_dims(lines: list[Any], inputs: list[Any], names: list[str] | None) -> None:
    """Append to ``__check_inputs_outputs`` (the last block written) a check that the dims of
    the inputs whose size is one symbolic expression are equal; ``names`` are forward's."""
    import sympy

    seen: dict[Any, tuple[int, int]] = {}
    checks: list[str] = []

    def label(i: int) -> str:
        return names[i] if names and i < len(names) else f"input {i}"

    for i, tensor in enumerate(inputs):
        get_size = getattr(tensor, "get_size", None)
        if get_size is None:
            continue
        for axis, size in enumerate(get_size()):
            if isinstance(size, int | sympy.Integer):
                continue
            if size not in seen:
                seen[size] = (i, axis)
                continue
            j, other = seen[size]
            checks.append(
                f"if (ConstantHandle(input_handles[{i}]).sizes()[{axis}] != "
                f"ConstantHandle(input_handles[{j}]).sizes()[{other}]) {{ std::stringstream ss; "
                f'ss << "{label(i)} dim {axis} is " << ConstantHandle(input_handles[{i}])'
                f'.sizes()[{axis}] << " but must equal {label(j)} dim {other}, which is " << '
                f'ConstantHandle(input_handles[{j}]).sizes()[{other}] << "\\n"; '
                "throw std::runtime_error(std::move(ss).str()); }"
            )
    if not checks:
        return
    text = [line.strip() if isinstance(line, str) else None for line in lines]
    end = max(i for i, t in enumerate(text) if t == "}")
    lines[end:end] = ["// ptconvert: inputs that share a size agree on it", *checks]
