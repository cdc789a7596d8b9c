"""The options of every command, as one dataclass: the CLI's flags by name (``--dynamic-batch``
is ``dynamic_batch``), and the keywords of the API's functions."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
    device: str = "cpu"  # aoti targets are compiled for it; --bench and checks run on it
    aoti_options: dict[str, Any] = field(default_factory=dict)  # Inductor configs (k=v)
    opset: int | None = None  # onnx targets: the ai.onnx opset (None: the exporter's default)
    external_data: bool = False  # onnx targets: weights in NAME.onnx.data (always over 2 GB)
    onnx_optimize: bool = False  # onnx targets: onnxscript's graph optimizer on the result
