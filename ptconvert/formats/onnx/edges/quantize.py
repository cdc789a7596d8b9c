"""``--quantize int8`` of the onnx target: the checked float graph, quantized by onnxruntime's
``quantize_dynamic`` (8-bit weights per output channel, activations quantized per call:
``DynamicQuantizeLinear`` → ``MatMulInteger``; both unsigned, u8u8: on an x86 CPU without VNNI,
onnxruntime's u8s8 kernel (signed weights) saturates its 16-bit sums, and a tiny Llama's logits
fell to cosine 0.957 against float32 on an AVX2 EPYC, 0.998 as u8u8), written in place of the
float one in the staging folder, checked by ``onnx.checker`` again. The export ran onnxscript's
optimizer first, which folds each weight's transpose into its initializer: onnxruntime quantizes
a MatMul whose second input is an initializer, nothing else. The conversion's check judges the
result by accuracy against float32 eager (``program_check._judged_by_accuracy``); the ledger
says which MatMul and Gemm nodes were quantized and which were left floating, and why."""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from ptconvert.convert.state import RunState
from ptconvert.deps import require
from ptconvert.errors import UnsupportedConversionError
from ptconvert.model.quantize import QuantizeLedger

# the float ops onnxruntime's dynamic quantization may replace, and those it writes for them
WEIGHT_OPS = ("MatMul", "Gemm")
QUANTIZED_OPS = ("MatMulInteger", "DynamicQuantizeLinear", "ConvInteger")


def quantize_written(state: RunState, scheme: str, external: bool) -> None:
    """Replace the staged float graph with its ``scheme`` quantization; fill the ledger."""
    onnx = require("onnx")
    require("onnxruntime")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    assert state.staged is not None
    before = onnx.load(str(state.staged), load_external_data=False).graph
    float_bytes = _bytes(state.staged, state.companions)
    stage = Path(tempfile.mkdtemp(prefix="quantized.", dir=state.staged.parent))
    quantized = stage / state.staged.name
    try:
        quantize_dynamic(
            str(state.staged),
            str(quantized),
            op_types_to_quantize=list(WEIGHT_OPS),
            per_channel=True,  # a scale per output channel: rows of very different ranges
            weight_type=QuantType.QUInt8,  # u8u8: no saturation on any CPU (above)
            use_external_data_format=external,
        )
        onnx.checker.check_model(str(quantized), full_check=True)
    except Exception as exc:
        raise UnsupportedConversionError(
            f"onnxruntime's quantize_dynamic failed on the exported graph: {str(exc)[:300]}",
            path=state.src,
        ) from None
    for old in [state.staged, *state.companions]:
        old.unlink()
    state.companions = []
    for made in stage.iterdir():
        os.replace(made, state.staged.parent / made.name)
        if made.name != state.staged.name:
            state.companions.append(state.staged.parent / made.name)
    stage.rmdir()
    after = onnx.load(str(state.staged), load_external_data=False).graph
    state.quantized = ledger(before, after, scheme)
    ratio = _bytes(state.staged, state.companions) / max(float_bytes, 1)
    state.notes.append(
        f"quantized: {state.quantized.summary()}; {ratio:.2f}× the float32 graph's bytes"
    )


def ledger(before: Any, after: Any, scheme: str) -> QuantizeLedger:
    """Which MatMul/Gemm nodes of the float graph ``before`` are quantized in ``after`` (gone as
    float ops) and which were left, with why."""
    found = QuantizeLedger(
        scheme, "onnxruntime quantize_dynamic (uint8 weights per channel, dynamic activations)"
    )
    weights = {i.name for i in before.initializer}
    kept = {n.name for n in after.node if n.op_type in WEIGHT_OPS}
    for node in before.node:
        if node.op_type not in WEIGHT_OPS:
            continue
        if node.name not in kept:
            found.add_quantized(node.name)
        elif node.op_type == "Gemm":
            found.add_left(node.name, "onnxruntime's dynamic quantization has no Gemm kernel")
        elif not weights & set(node.input):
            found.add_left(node.name, "two activations (no weight to quantize)")
        else:
            found.add_left(node.name, "onnxruntime kept it floating")
    ops = Counter(n.op_type for n in after.node if n.op_type in (*QUANTIZED_OPS, *WEIGHT_OPS))
    found.ops = dict(sorted(ops.items()))
    return found


def _bytes(main: Path, companions: list[Path]) -> int:
    return sum(p.stat().st_size for p in [main, *companions])
