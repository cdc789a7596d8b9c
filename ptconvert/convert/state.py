"""What a conversion carries from step to step (the options that steer it: ptconvert.options)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert.model.inputs import ExampleInputs
from ptconvert.report import Report
from ptconvert.weights.read import WeightSet


@dataclass
class StepRecord(Report):
    step: str
    route: str
    seconds: float
    status: str  # "ok" | "failed"
    notes: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class RunState:
    src: Path
    src_format: str
    output: Path | None = None  # the temporary path the final step writes
    weights: WeightSet | None = None
    module: Any = None  # nn.Module
    reference: Any = None  # the eager module the result is checked against
    scripted: Any = None  # ScriptModule
    exported: Any = None  # ExportedProgram
    inputs: ExampleInputs | None = None
    dynamic_range: dict[str, str] = field(default_factory=dict)
    positional: list[str] | None = None  # the program takes these inputs positionally
    notes: list[str] = field(default_factory=list)
