"""``--quantize`` applied to the eager model before export (a target whose
``Format.quantizes_module``: pt2), by torchao, and the ledger every target's quantizer fills:
what was quantized and what was left floating, and why.

int8 is torchao's ``Int8WeightOnlyConfig``: each ``nn.Linear``'s weight becomes an ``Int8Tensor``
(int8 values, a float scale per output row), activations stay float32; torch.export keeps the
subclass and ``torch.export.save``/``load`` carry it (loading imports torchao). A Linear whose
weight is tied to another module's (a language model's head and its embedding) is left: the
embedding keeps the float weight, so an int8 copy would add to the file, not shrink it."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from ptconvert.deps import require
from ptconvert.report import Report

# where a ledger's names stop being listed (the counts stay whole): the report stays one screen
LISTED = 12


@dataclass
class QuantizeLedger(Report):
    """What ``--quantize`` changed: the modules (torchao) or graph nodes (onnxruntime) whose
    weights are quantized now, and those left floating with the reason."""

    scheme: str
    by: str  # the quantizer and its settings
    quantized: int = 0
    quantized_names: list[str] = field(default_factory=list)  # the first LISTED
    left: dict[str, str] = field(default_factory=dict)  # name → why (the first LISTED)
    left_count: int = 0
    ops: dict[str, int] = field(default_factory=dict)  # the quantized graph's ops (ONNX)

    def add_left(self, name: str, why: str) -> None:
        self.left_count += 1
        if len(self.left) < LISTED:
            self.left[name] = why

    def add_quantized(self, name: str) -> None:
        self.quantized += 1
        if len(self.quantized_names) < LISTED:
            self.quantized_names.append(name)

    def summary(self) -> str:
        reasons = sorted(set(self.left.values()))
        left = f", {self.left_count} left ({'; '.join(reasons)})" if self.left_count else ""
        ops = ", ".join(f"{k} {v}" for k, v in self.ops.items())
        return f"{self.scheme} by {self.by}: {self.quantized} quantized{left}" + (
            f"; ops: {ops}" if ops else ""
        )


def quantize_module(module: Any, reference: Any, scheme: str) -> tuple[Any, QuantizeLedger]:
    """Quantize ``module`` (and ``reference``, when it is a module of its own) in place by
    ``scheme``; returns the float reference (a copy taken before) and the ledger."""
    import torch

    require("torchao")
    float_reference = copy.deepcopy(reference)
    ledger = QuantizeLedger(scheme, "torchao Int8WeightOnlyConfig (per output row)")
    for model in dict.fromkeys(m for m in (module, reference) if isinstance(m, torch.nn.Module)):
        _torchao_int8(model, ledger if model is module else None)
    return float_reference, ledger


def _torchao_int8(model: Any, ledger: QuantizeLedger | None) -> None:
    import torch
    from torchao.quantization import Int8WeightOnlyConfig, quantize_
    from torchao.utils import TorchAOBaseTensor

    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    owners: dict[int, str] = {}  # a parameter → the first module name that holds it
    for name, m in model.named_modules():
        for p in m.parameters(recurse=False):
            owners.setdefault(id(p), name)
    tied = {n for n, m in linears.items() if owners.get(id(m.weight)) != n}

    def chosen(m: Any, name: str) -> bool:
        # a module the reference wraps (NamedOutputs) is quantized once, with the module
        done = isinstance(getattr(m, "weight", None), TorchAOBaseTensor)
        return isinstance(m, torch.nn.Linear) and name not in tied and not done

    # set_inductor_config False: torchao would change torch.compile's settings process-wide
    quantize_(model, Int8WeightOnlyConfig(set_inductor_config=False), filter_fn=chosen)
    if ledger is None:
        return
    for name, m in linears.items():
        if name in tied:
            ledger.add_left(name, f"its weight is tied to {owners[id(m.weight)]}'s")
        elif type(m.weight).__name__ == "Int8Tensor":
            ledger.add_quantized(name)
        else:
            ledger.add_left(name, "torchao kept it floating")
