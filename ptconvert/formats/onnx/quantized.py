"""What of an ONNX graph is quantized, for ``info``: its quantized operators (onnxruntime's
dynamic quantizer writes DynamicQuantizeLinear and MatMulInteger, its static one QLinear* or
QuantizeLinear/DequantizeLinear pairs, its contrib ops MatMulNBits, QGemm, …) and the integer
weights they take, counted by dtype, read from the graph without running it."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from ptconvert.formats.base import Quantization

# an operator that quantizes, dequantizes or computes on quantized values (without its domain)
_QUANTIZED_OP = re.compile(r"Integer|Quantize|^QLinear|^Q[A-Z][a-z]|NBits")
# the input an operator takes its quantized weight at (when that input is an initializer)
_WEIGHT_INPUT = {
    "MatMulInteger": 1,
    "ConvInteger": 1,
    "MatMulIntegerToFloat": 1,
    "DynamicQuantizeMatMul": 1,
    "MatMulNBits": 1,
    "QLinearMatMul": 3,
    "QLinearConv": 3,
    "QGemm": 3,
    "DequantizeLinear": 0,  # the QDQ form: a weight stored quantized, dequantized in the graph
}


def is_quantized_op(op: str) -> bool:
    """Whether ``op`` (``domain.Name`` or ``Name``) is one of the quantized operators."""
    return bool(_QUANTIZED_OP.search(op.rsplit(".", 1)[-1]))


def quantization(graph: Any, ops: Counter[str], dtypes: dict[str, str]) -> Quantization | None:
    """The graph's quantized operators (from ``ops``, every node's op counted) and the weights
    they take quantized (initializers by name in ``dtypes``), None when there is neither."""
    quantized_ops = {op: n for op, n in ops.most_common() if is_quantized_op(op)}
    weights: dict[str, str] = {}
    for node in graph.node:
        at = _WEIGHT_INPUT.get(node.op_type)
        if at is not None and at < len(node.input) and node.input[at] in dtypes:
            weights[node.input[at]] = dtypes[node.input[at]]
    if not quantized_ops and not weights:
        return None
    return Quantization(quantized_ops, dict(sorted(Counter(weights.values()).items())))
