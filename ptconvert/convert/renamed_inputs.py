"""A program whose inputs are named otherwise than the model's: TorchScript converted to an
ExportedProgram by torch's TS2EPConverter calls ``x`` ``x_1``. The check resizes, binds and
reports the model's names; the program is fed under its own."""

from __future__ import annotations

from typing import Any

from ptconvert.convert.state import RunState


def program_names(state: RunState) -> dict[str, str] | None:
    """A program that takes its inputs positionally under other names than the model's
    (TorchScript converted by TS2EP names ``x`` ``x_1``): its names → the example's, by
    position; None when they are the same."""
    if state.exported is None or state.positional is None:
        return None
    from ptconvert.verify.dims import user_inputs

    names = [n for n, _ in user_inputs(state.exported)]
    if len(names) != len(state.positional):
        return None
    return {p: e for p, e in zip(names, state.positional, strict=True) if p != e} or None


def fed_as(program: Any, names: dict[str, str]) -> Any:
    """An in-process program called with the example's names, fed under its own (``names``:
    example → program, ``program_names`` reversed): its positional call then binds each input
    to its place, not in the example's order."""
    import dataclasses

    def fed(call: Any) -> Any:
        return lambda **kw: call(**{names.get(k, k): v for k, v in kw.items()})

    call_of = program.call_of
    return dataclasses.replace(
        program,
        call=fed(program.call),
        call_of=None if call_of is None else (lambda m: fed(call_of(m))),
    )
