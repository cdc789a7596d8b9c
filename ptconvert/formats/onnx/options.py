"""The ONNX target's own options (``OnnxFormat.options_class``): the CLI's ``--opset``,
``--external-data``, ``--onnx-optimize`` and ``--onnx-exporter``, the API's keywords of the
same names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from ptconvert.errors import UsageError
from ptconvert.options import flag

Exporter = Literal["dynamo", "torchscript"]


@dataclass
class OnnxOptions:
    # the ai.onnx opset (None: the exporter's default)
    opset: int | None = field(
        default=None,
        metadata=flag("--opset", type=int, help="--to onnx: the ai.onnx opset (default: torch's)."),
    )
    # weights in NAME.onnx.data (always over 2 GB: protobuf's limit)
    external_data: bool = field(
        default=False,
        metadata=flag(
            "--external-data",
            help="--to onnx: weights in NAME.onnx.data beside the model (always over 2 GB).",
        ),
    )
    # onnxscript's graph optimizer on the result
    onnx_optimize: bool = field(
        default=False,
        metadata=flag("--onnx-optimize", help="--to onnx: run onnxscript's graph optimizer."),
    )

    # which of torch.onnx's exporters writes the graph: the dynamo exporter from the
    # ExportedProgram, or TorchScript's (a trace of the module, as optimum-cli exports)
    onnx_exporter: Exporter = field(
        default="dynamo",
        metadata=flag(
            "--onnx-exporter",
            choices=get_args(Exporter),
            help="--to onnx: torch.onnx's dynamo exporter (from torch.export), or TorchScript's "
            "(a trace of the module, as optimum-cli exports: faster, control flow frozen).",
        ),
    )

    def validate(self) -> None:
        opset = self.opset
        whole = isinstance(opset, int) and not isinstance(opset, bool)
        if opset is not None and not (whole and opset >= 1):
            raise UsageError(f"opset is a positive integer, got {opset!r}")
