"""Result dataclasses share one JSON form: ``to_dict()`` (the CLI's ``--json``)."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, Self


def to_jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


class Report:
    """Mixin for result dataclasses."""

    def to_dict(self) -> dict[str, Any]:
        out = to_jsonable(self)
        assert isinstance(out, dict)
        return out

    def to_json(self, indent: int | None = 2) -> str:
        import json

        return json.dumps(self.to_dict(), indent=indent, default=str)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """The result ``to_dict`` wrote, rebuilt with its nested results, by the fields' types
        (a field typed ``Any`` keeps its JSON); a key the class has no field for is an error
        (ValueError), a missing one takes the field's default."""
        built = _from_jsonable(cls, data)
        assert isinstance(built, cls)
        return built


def _from_jsonable(kind: Any, value: Any) -> Any:
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        if not isinstance(value, dict):
            raise ValueError(f"{kind.__name__}: expected an object, got {type(value).__name__}")
        hints = typing.get_type_hints(kind)
        names = {f.name for f in dataclasses.fields(kind) if f.init}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ValueError(f"{kind.__name__}: no field {unknown}")
        return kind(**{k: _from_jsonable(hints[k], v) for k, v in value.items()})
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        alternatives = [a for a in args if a is not type(None)]
        return _from_jsonable(alternatives[0], value) if len(alternatives) == 1 else value
    if origin is list and args:
        return [_from_jsonable(args[0], v) for v in value]
    if origin is dict and len(args) == 2:
        return {k: _from_jsonable(args[1], v) for k, v in value.items()}
    return value  # a scalar, a Literal, Any


# The statuses results carry, as types (the values a pipeline compares against).
Check = Literal[
    "parity", "bitwise", "copy", "generation", "readback", "none"
]  # which check a conversion ran
Verdict = Literal["clean", "needs-code", "dangerous", "error"]  # a scan's
StepStatus = Literal["ok", "failed"]
ParityStatus = Literal[
    "pass",
    "fail_accuracy",
    "fail_shape",
    "fail_to_run",
    "eager_nondeterministic",
    "nothing_compared",  # no batch size was run: a verdict without evidence is not a pass
    "skipped",  # the eager model itself raised at this size: it says nothing of the program
]
