"""A program's own shape guards, read and evaluated without running it.

When the program's shape guards are readable (:func:`shape_guards`, torch's private
``ExportedProgram._guards_code``) they are evaluated over a probed span first, at no cost, to
place the probes on the edges they draw and to recognise a step ("even sizes only"): a guard
like ``-3 + (-3 + x.size()[2]) // 2 != 1`` rejects sizes that the range torch guarantees admits.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from ptconvert import _compat
from ptconvert.verify.probes import Key

_SOURCE = re.compile(r"L\['(\w+)'\]\.size\(\)\[(\d+)\]")


class _Sized:
    """Stands in for a tensor in guard code: ``L['x'].size()[2]``."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def size(self) -> tuple[int, ...]:
        return self.shape


@dataclass
class GuardSet:
    """The program's shape guards as Python expressions over input shapes. Called with shapes,
    it gives the first guard they break, in torch's words, or None when all hold."""

    guards: list[tuple[str, Any, frozenset[Key]]]  # (text, code, dims it reads)
    _scope: dict[str, Any] = field(default_factory=dict, repr=False)

    def __call__(
        self,
        shapes: dict[str, tuple[int, ...]],
        only: frozenset[Key] | None = None,
        touching: frozenset[Key] | None = None,
    ) -> str | None:
        """``only``: judge just the guards that read nothing else; ``touching``: just those that
        read one of these (the others do not change when only these dims do)."""
        if not self._scope:
            from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

            self._scope.update({**SYMPY_INTERP, "math": math, "inf": math.inf})
        sources = {name: _Sized(shape) for name, shape in shapes.items()}
        for text, code, reads in self.guards:
            if (only is not None and not reads <= only) or (
                touching is not None and not reads & touching
            ):
                continue
            try:
                held = eval(code, self._scope, {"L": sources})  # torch's generated guard code
            except Exception:  # a guard over something this stand-in lacks: not judged here
                continue
            if not held:
                return "Guard failed: " + _SOURCE.sub(r"\1.size()[\2]", text)
        return None

    def ties(self, own: frozenset[Key], dynamic: frozenset[Key]) -> list[Key]:
        """Dynamic dims outside ``own`` that an equality guard relates to ``own``'s."""
        out: dict[Key, None] = {}
        for text, _code, reads in self.guards:
            if "==" in text and reads & own:
                out.update(dict.fromkeys(sorted(reads & dynamic - own)))
        return list(out)


def shape_guards(ep: Any, rename: dict[str, str] | None = None) -> GuardSet | None:
    """The guards torch checks when the program is called (private ``_guards_code``, kept by
    ``torch.export.save``), or None when this torch has none to read. ``rename``: the program's
    input names → the caller's (``verify``'s reference names), the guards read by those."""
    from ptconvert.verify.dims import DeclaredDims

    if isinstance(ep, DeclaredDims):  # declared, not traced: no guards recorded
        return None
    codes = _compat.torch_api.guards_code(ep)
    if not codes:
        return None
    names = rename or {}
    guards = []
    for text in codes:
        text = _SOURCE.sub(lambda m: f"L['{names.get(m[1], m[1])}'].size()[{m[2]}]", text)
        try:
            code = compile(text, "<guard>", "eval")
        except SyntaxError:
            continue
        reads = frozenset((n, int(a)) for n, a in _SOURCE.findall(text))
        guards.append((text, code, reads))
    return GuardSet(guards) if guards else None
