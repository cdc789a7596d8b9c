"""What a conversion reports (the CLI's ``--json``, the API's return value, the cache's stored
record): one dataclass, written by ``to_dict`` and read back by ``from_dict``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ptconvert.convert.state import StepRecord
from ptconvert.report import Check, Report
from ptconvert.verify.parity import ParityReport


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
    # "copy" (bytes compared), or "none" (--no-verify, or nothing to run it against)
    check: Check = "none"
    bench: Any = None  # a verify.bench.BenchReport when --bench was given
    cached: bool = False  # copied from the cache: the steps and check are those that filled it
