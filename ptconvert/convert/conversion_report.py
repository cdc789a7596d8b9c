"""What a conversion reports (the CLI's ``--json``, the API's return value, the cache's stored
record): one dataclass for every conversion, written by ``to_dict`` and read back by
``from_dict``; a conversion that wrote weights says what it wrote in ``weights``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ptconvert.convert.state import StepRecord
from ptconvert.model.quantize import QuantizeLedger
from ptconvert.report import Check, Report
from ptconvert.verify.accuracy import AccuracyReport
from ptconvert.verify.parity import ParityReport
from ptconvert.verify.weights import WeightsCheck


@dataclass
class WeightsWritten(Report):
    """The weights a conversion read and wrote (the weights fast path)."""

    path: str  # "fast" (kernel byte copies) or "torch" (some tensors rebuilt in memory)
    tensors: int
    stored: int
    bytes: int
    files: list[str]
    unwrapped: str | None = None
    stripped_prefix: str | None = None
    aliases: dict[str, str] = field(default_factory=dict)
    other_contents: dict[str, str] = field(default_factory=dict)
    verification: WeightsCheck | None = None  # the bitwise check, when it ran
    skipped: dict[str, str] = field(default_factory=dict)  # left out (--skip-unsupported): why
    cast_to: str | None = None  # --dtype: the floating tensors written in it


@dataclass
class GenerationResult(Report):
    """What a generation export (``--task …-with-past``) carries, and how it generated."""

    task: str
    model_class: str
    # the cache the artifact carries: {"kind": "static", "batch_size", "length"} (pt2, aoti,
    # pte) or {"kind": "inputs", "layers", "past", "present"} (ONNX past/present)
    cache: dict[str, Any]
    # generation.check.GenerationCheck: greedy tokens and each step's logits against
    # transformers' generate (None: --no-verify)
    check: Any = None


@dataclass
class ConversionReport(Report):
    source: str
    source_format: str
    output: str
    target_format: str
    route: list[str]
    steps: list[StepRecord]
    seconds: float
    notes: list[str] = field(default_factory=list)
    dynamic_range: dict[str, str] = field(default_factory=dict)
    parity: ParityReport | None = None
    # how to call the result: {"call": "prog(x, mask)", "inputs": [...], "keyword": bool,
    # "outputs": [...], "accepts": [...]} (programs only)
    interface: dict[str, Any] = field(default_factory=dict)
    # the check that ran: "parity" (run against eager), "bitwise" (weights read back),
    # "copy" (bytes compared), "readback" (a target's own step read it back and ran it in its
    # client: a GGUF), or "none" (--no-verify, or nothing to run it against)
    check: Check = "none"
    bench: Any = None  # a verify.bench.BenchReport when --bench was given
    cached: bool = False  # copied from the cache: the steps and check are those that filled it
    weights: WeightsWritten | None = None  # a weights target written from a weights source
    generation: GenerationResult | None = None  # a generation export (--task …-with-past)
    # --dtype, --quantize on a program: its accuracy against float32 eager (typed: a report read
    # back from the cache is rebuilt as one, and renders as one)
    accuracy: AccuracyReport | None = None
    quantized: QuantizeLedger | None = None  # --quantize: what was quantized, what was left
