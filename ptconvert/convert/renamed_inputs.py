"""A program whose inputs are named otherwise than the model's: TorchScript converted to an
ExportedProgram by torch's TS2EPConverter calls ``x`` ``x_1``. The check resizes, binds and
reports the model's names; the program is fed in its own order."""

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


def renamed_where(where: str, names: dict[str, str]) -> str:
    """A range's key (``x_1 dim 0``) with its input renamed by ``names``."""
    name, dim, axis = where.rpartition(" dim ")
    return f"{names.get(name, name)}{dim}{axis}" if dim else where


class InOrder:
    """``call`` fed its named inputs in ``names`` order: a program under other names than the
    model's binds them by position (the in-process program, an AOTI package's runner), so the
    example's order (``--input``'s, a safetensors file's sorted keys) must not decide it.
    ``close`` reaches a runtime's process."""

    def __init__(self, call: Any, names: list[str]) -> None:
        self.call, self.names = call, names

    def __call__(self, **kw: Any) -> Any:
        ordered = {n: kw[n] for n in self.names if n in kw}
        return self.call(**ordered, **{k: v for k, v in kw.items() if k not in ordered})

    def close(self) -> None:
        close = getattr(self.call, "close", None)
        if close is not None:
            close()


def in_order(program: Any, names: list[str]) -> Any:
    """``program`` (a ``formats.program.Program``) with its calls fed in ``names`` order."""
    import dataclasses

    call_of = program.call_of
    return dataclasses.replace(
        program,
        call=InOrder(program.call, names),
        call_of=None if call_of is None else (lambda m: InOrder(call_of(m), names)),
    )
