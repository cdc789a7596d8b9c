"""What a conversion carries from step to step (the options that steer it: ptconvert.options)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert.formats.weightset import WeightSet
from ptconvert.model.inputs import ExampleInputs
from ptconvert.report import Report, StepStatus

# (input, axis) → (min, max or None): the sizes a dynamic dim is exported with
Bounds = dict[tuple[str, int], tuple[int, int | None]]


@dataclass
class StepRecord(Report):
    step: str
    route: str
    seconds: float
    status: StepStatus
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    peak_rss_mib: float | None = None  # the process's peak resident memory when it ended


@dataclass
class RunState:
    src: Path
    src_format: str
    output: Path | None = None  # the temporary path the final step writes
    leads_to: str = ""  # the node the running step leads to (the format a write step writes)
    target: str = ""  # the route's target
    destination: Path | None = None  # where the output goes once it is checked
    weights: WeightSet | None = None
    module: Any = None  # nn.Module
    reference: Any = None  # the eager module the result is checked against
    # --dtype, --quantize (a target that quantizes the module): the eager module in float32,
    # before the cast or quantization, for the accuracy check
    float_reference: Any = None
    accuracy: Any = None  # --dtype, --quantize: verify.accuracy.AccuracyReport
    quantized: Any = None  # --quantize: model.quantize.QuantizeLedger
    scripted: Any = None  # ScriptModule
    exported: Any = None  # ExportedProgram
    # verify.dims.DeclaredDims: the dynamic dims a program without an ExportedProgram was
    # written with (ONNX from TorchScript's exporter), which the check probes
    declared: Any = None
    # the written file's own input and output names, where it states them (an ONNX graph's):
    # the report's interface says these (a trace leaves out an input it does not read, and
    # names a tuple's outputs output_0, output_1)
    graph_names: tuple[list[str], list[str]] | None = None
    inputs: ExampleInputs | None = None
    dynamic_range: dict[str, str] = field(default_factory=dict)
    # the range verification found to hold for a dynamic dim where the first program ran wrong
    # outside it: exported again with it, the file refuses the sizes outside
    bounds: Bounds = field(default_factory=dict)
    positional: list[str] | None = None  # the program takes these inputs positionally
    # a capture with ways of its own (--method auto: script, else trace): the step says it has
    # another way left (``another_way``); the check's refusals of the ways it took, which the
    # engine runs it again after (``refused``), for the step to take the next
    another_way: bool = False
    refused: list[str] = field(default_factory=list)
    # model.axes.Axis made dynamic by default (not asked for): given up where a step cannot
    family_axes: list[Any] = field(default_factory=list)
    # the check gave them up (with them the program refused batch 1): exported without them
    static_axes: bool = False
    # the step that writes the output is the route's last: it writes ``output``
    writing: bool = False
    # a target of several files (ONNX with external data) is written into a staging folder
    # beside the output: ``staged`` (the main file there) is checked, then its companions are
    # put in place before the main file is
    staged: Path | None = None
    companions: list[Path] = field(default_factory=list)
    obsolete: list[Path] = field(default_factory=list)  # files of a replaced output, removed
    notes: list[str] = field(default_factory=list)
    # a weights route: the source's security scans (the check loads a program only when they
    # are clean), whether the output is a folder, the files the write step wrote
    scans: list[Any] | None = None
    folder: bool = False
    written: list[Path] = field(default_factory=list)
    example_seconds: float | None = None  # one eager call at the example's size
    steps_seconds: float = 0.0  # the route's steps so far (the check's work is sized by them)
    changes: list[str] = field(default_factory=list)  # the state a call changes (buffers …)
    fresh: Any = None  # verify.fresh_load.FreshLoad: an interpreter started for the written file
    eager: Any = None  # parity.EagerRuns: eager's outputs so far (program_check.first_call)
    # the check a target's own step ran on what it wrote (report.Check: a GGUF's "readback")
    checked: str = ""
