"""What a conversion carries from step to step, and the options that steer it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert.convert.inputs import ExampleInputs
from ptconvert.convert.weights_read import WeightSet
from ptconvert.report import Report


@dataclass
class Options:
    model: str | None = None
    model_args: dict[str, Any] = field(default_factory=dict)
    task: str | None = None
    inputs: list[str] = field(default_factory=list)
    example_inputs: Path | None = None
    dynamic_batch: bool = False
    dynamic: list[str] = field(default_factory=list)
    method: str = "auto"  # torchscript: auto | script | trace
    strict: str = "auto"  # export: auto (non-strict, then strict) | strict | non-strict
    trust: bool = False
    key: str | None = None
    non_strict: bool = False  # leave out checkpoint keys the model does not have (reported)
    keep_prefix: bool = False
    skip_unsupported: bool = False
    verify: bool = True
    force: bool = False
    seed: int = 0  # example inputs are drawn from this seed (and the batch size)
    max_shard_size: str | None = None  # safetensors targets: shards of at most this (e.g. "5GB")
    metadata: dict[str, str] = field(default_factory=dict)  # safetensors header metadata


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
