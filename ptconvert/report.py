"""Result dataclasses share one JSON form: ``to_dict()`` (the CLI's ``--json``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal


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


# The statuses results carry, as types (the values a pipeline compares against).
Check = Literal["parity", "bitwise", "copy", "none"]  # which check a conversion ran
Verdict = Literal["clean", "needs-code", "dangerous", "error"]  # a scan's
StepStatus = Literal["ok", "failed"]
ParityStatus = Literal[
    "pass",
    "fail_accuracy",
    "fail_shape",
    "fail_to_run",
    "eager_nondeterministic",
    "nothing_compared",  # no batch size was run: a verdict without evidence is not a pass
]
