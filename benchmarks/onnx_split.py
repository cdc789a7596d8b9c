"""Where an ONNX export of a tiny BERT spends its time inside torch, and what the faster
exporter optimum uses would give instead.

benchmarks/onnx.py times whole runs against ``optimum-cli``; this one opens up the export the
ONNX row is made of. Each round runs in a fresh interpreter (``--round``), as a user's run does:

- **ptconvert**: ``ptconvert.convert(DIR, "onnx", dynamic_batch=True, cache=False)`` with
  torch's three stages timed from outside (``torch.export.export``;
  ``ExportedProgram.run_decompositions``, which torch.onnx calls to lower the program to the
  operators its registry translates, tracing it a second time; the rest of
  ``torch.onnx.export``: its registry, the translation, onnx's checker) beside ptconvert's step
  times and its check;
- **TorchScript's exporter** (``torch.onnx.export(..., dynamo=False)``, the one optimum-cli
  runs): its seconds, and its ONNX model's largest error against the eager model at shapes
  other than the example's (onnxruntime), where a trace that fixed a shape computes something
  else.

Run: ``.venv/bin/python benchmarks/onnx_split.py [--repeats 3]``. Prints medians.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

# this folder's onnx.py would shadow the onnx package the export imports
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
SHAPES = [(1, 1), (1, 5), (3, 17), (7, 64)]  # (batch, sequence) other than the example's


def tiny_bert(out: Path) -> Path:
    import torch
    import transformers as t

    torch.manual_seed(0)
    config = t.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=64,
    )  # fmt: skip
    t.BertModel(config).eval().save_pretrained(out)
    return out


def timed(owner: Any, name: str, spent: dict[str, float], label: str) -> None:
    """Wrap ``owner.name`` so its seconds add up under ``label``."""
    inner = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - start

    setattr(owner, name, wrapper)


def ptconvert_round(model: Path, work: Path) -> dict[str, float]:
    start = time.perf_counter()
    import torch
    import torch.export
    import torch.onnx

    import ptconvert

    spent: dict[str, float] = {}
    timed(torch.export, "export", spent, "torch.export")
    timed(torch.export.ExportedProgram, "run_decompositions", spent, "run_decompositions")
    timed(torch.onnx, "export", spent, "torch.onnx.export")
    report = ptconvert.convert(
        model, "onnx", work / "bert.onnx", dynamic_batch=True, cache=False, force=True
    )
    steps = {s.step: s.seconds for s in report.steps}
    return {
        "process (imports before the steps)": time.perf_counter() - start - report.seconds,
        "build the model (import transformers, from_pretrained)": steps["build_module"],
        "torch.export": spent["torch.export"],
        "run_decompositions (torch.onnx's second trace)": spent["run_decompositions"],
        "torch.onnx.export less run_decompositions": spent["torch.onnx.export"]
        - spent["run_decompositions"],
        "ptconvert's check": report.seconds - sum(steps.values()),
        "total": time.perf_counter() - start,
    }


def torchscript_round(model: Path, work: Path) -> dict[str, float]:
    import numpy as np
    import onnxruntime as ort
    import torch
    import transformers

    names = ["input_ids", "attention_mask", "token_type_ids"]

    class ByName(torch.nn.Module):  # optimum calls the model by keyword too
        def __init__(self) -> None:
            super().__init__()
            self.bert = transformers.BertModel.from_pretrained(model).eval()

        def forward(self, *feed: torch.Tensor) -> torch.Tensor:
            return self.bert(**dict(zip(names, feed, strict=True))).last_hidden_state

    bert = ByName().eval()

    def inputs(batch: int, seq: int, padded: bool = True) -> tuple[torch.Tensor, ...]:
        """Token ids; a mask that pads every row but the first (a batch as users send it),
        or none padded (optimum's dummy inputs, the example)."""
        ids = torch.randint(0, 99, (batch, seq), generator=torch.Generator().manual_seed(seq))
        mask = torch.ones_like(ids)
        if padded:
            mask[1:, seq // 2 + 1 :] = 0
        return ids, mask, torch.zeros_like(ids)

    axes = {n: {0: "batch_size", 1: "sequence_length"} for n in names}
    axes["last_hidden_state"] = {0: "batch_size", 1: "sequence_length"}
    path = work / "torchscript.onnx"
    start = time.perf_counter()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            bert, inputs(2, 8, padded=False), str(path), input_names=names,
            output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17,
            dynamo=False,
        )  # fmt: skip
    seconds = time.perf_counter() - start
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for batch, seq in SHAPES:
        feed = inputs(batch, seq)
        with torch.no_grad():
            want = bert(*feed).numpy()
        feeds = {n: t.numpy() for n, t in zip(names, feed, strict=True)}
        got = session.run(["last_hidden_state"], feeds)[0]
        worst = max(worst, float(np.abs(got - want).max()))
    return {
        "TorchScript export (optimum's exporter)": seconds,
        "its max |error| at other shapes": worst,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--round", nargs=2, metavar=("KIND", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.round:  # one fresh interpreter's round: its figures as JSON on stdout
        kind, folder = args.round[0], Path(args.round[1])
        with tempfile.TemporaryDirectory() as tmp:
            run = ptconvert_round if kind == "ptconvert" else torchscript_round
            with contextlib.redirect_stdout(sys.stderr):
                figures = run(folder, Path(tmp))
        print(json.dumps(figures))
        return
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_bert(Path(tmp) / "bert")
        for _ in range(args.repeats):
            for kind in ("ptconvert", "torchscript"):
                command = [sys.executable, __file__, "--round", kind, str(model)]
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                for k, v in json.loads(done.stdout.splitlines()[-1]).items():
                    rows.setdefault(k, []).append(v)
    print(f"tiny BERT → ONNX, dynamic batch and sequence; medians of {args.repeats} fresh rounds")
    for k, v in rows.items():
        unit = "" if "error" in k else " s"
        print(f"  {k:58s} {statistics.median(v):8.3f}{unit}")


if __name__ == "__main__":
    main()
