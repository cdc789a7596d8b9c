"""The AOTInductor target's own options (``AotiFormat.options_class``): ``--aoti-option k=v``,
Inductor's configs for the compile."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ptconvert.errors import UsageError
from ptconvert.options import flag


@dataclass
class AotiOptions:
    aoti_options: dict[str, Any] = field(  # Inductor configs (k=v)
        default_factory=dict,
        metadata=flag(
            "--aoti-option",
            multiple=True,
            parse="literal_values",
            help="k=v Inductor config for --to aoti (e.g. max_autotune=true; repeatable).",
        ),
    )

    def validate(self) -> None:
        if not isinstance(self.aoti_options, dict):
            raise UsageError(f"aoti_options is a dict, got {self.aoti_options!r}")
