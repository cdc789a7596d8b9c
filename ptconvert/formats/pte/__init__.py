"""ExecuTorch programs (``.pte``): a flatbuffer ``Program`` (file identifier ``ET12``), its
constants and delegate payloads in segments after it.

Detection reads the flatbuffer's file identifier (bytes 4–8: ``ET`` and two digits) and checks
that the root table lies inside the file. ``info`` describes what ``flatbuffer.py``
reads of the flatbuffer (no executorch import, nothing run): each method's inputs and outputs,
the backends its delegate calls go to, the operators left to the portable kernels, the constant
methods' values and the bytes of constants, delegate payloads and planned memory. The file
holds no pickle and no code: a delegate's payload is data that the runtime's own compiled-in
backend (XNNPACK) interprets.

Loading runs ExecuTorch's runtime (``executorch.runtime``) in a process of its own
(``formats/isolated.py``).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from ptconvert.deps import extra_hint, require_installed
from ptconvert.formats.base import (
    FileInfo,
    Format,
    IOSpec,
    Need,
    Probe,
    Quantization,
    file_entry,
    installed,
)
from ptconvert.formats.isolated import IsolatedRuntime
from ptconvert.formats.program import Program, Signature
from ptconvert.formats.pte.flatbuffer import (
    IDENTIFIER,
    PteMethod,
    PteTensor,
    forward_of,
    read_program,
)
from ptconvert.formats.pte.options import PteOptions
from ptconvert.formats.pte.runtime import load as load_runtime


def _io(items: list[PteTensor | str], names: list[str] | None, prefix: str) -> list[IOSpec]:
    if names is None or len(names) != len(items):
        names = [f"{prefix}{i}" for i in range(len(items))]
    return [
        IOSpec(n, t.dtype, list[int | str](t.sizes))
        if isinstance(t, PteTensor)
        else IOSpec(n, t, None)
        for n, t in zip(names, items, strict=True)
    ]


class PteFormat(Format):
    name = "pte"
    kind = "program"
    suffixes = (".pte",)
    holds = (
        "an ExecuTorch program (flatbuffer): methods of kernel calls and delegate calls "
        "(XNNPACK), constants and delegate payloads in segments; no pickle, no code"
    )
    priority = 10
    isolated = True
    packages = ("executorch",)
    extra = "executorch"
    options_class = PteOptions
    quantize_why = (
        "ExecuTorch's int8 needs the pt2e flow with XNNPACK's dynamic quantizer, not wired here yet"
    )
    needs = (
        Need(
            "executorch",
            extra_hint("executorch") + ": ExecuTorch's lowering and its runtime",
            installed("executorch"),
        ),
    )
    load_line = (
        "from executorch.runtime import Runtime\n"
        'prog = Runtime.get().load_program(p).load_method("forward")'
    )

    def call_line(self, args: str) -> str:
        names = [a.strip().removesuffix("=…") for a in args.split(",") if a.strip()]
        return f"prog.execute([{', '.join(names)}])"

    def match(self, probe: Probe) -> str | None:
        h = probe.head
        if len(h) < 16 or not IDENTIFIER.fullmatch(h[4:8]):
            return None
        root = int.from_bytes(h[0:4], "little")
        return "flatbuffer" if 8 <= root < probe.size else None

    def holds_no_pickle(self, head: bytes, path: Path) -> bool:
        return len(head) >= 8 and IDENTIFIER.fullmatch(head[4:8]) is not None

    def scan_notes(self, path: Path) -> list[str]:
        """What ``scan`` says of a .pte beside its verdict: no pickle, what runs its delegates."""
        program = read_program(path)
        backends = sorted({b for m in program.methods for b in m.delegates})
        notes = [
            "an ExecuTorch program (flatbuffer): it holds no pickle, and loading it imports "
            "nothing; its bytes were still read as the pickle torch.load would find at byte 0"
        ]
        if backends:
            notes.append(
                f"its delegate calls name {', '.join(backends)}: native code compiled into the "
                "ExecuTorch runtime runs them, on payloads stored in the file (data: the file "
                "carries no code or library of its own)"
            )
        else:
            notes.append("no delegate calls: every op runs on the runtime's portable kernels")
        return notes

    def info(self, path: Path, layout: str) -> FileInfo:
        program = read_program(path)
        info = FileInfo(str(path), self.name, layout, path.stat().st_size, [file_entry(path)])
        if not program.methods:
            info.notes.append("the program has no method")
            return info
        forward = forward_of(program)
        info.inputs = _io(forward.inputs, forward.input_names, "input_")
        info.outputs = _io(forward.outputs, forward.output_names, "output_")
        delegates = Counter[str]()
        for m in program.methods:
            delegates.update(m.delegates)
        info.metadata = {
            "version": program.version,
            "methods": {m.name: _method_words(m) for m in program.methods if m.returns is None},
            "delegates": dict(delegates),
            "data_bytes": program.segment_bytes,
        }
        literal = {m.name: _one(m.returns) for m in program.methods if m.returns is not None}
        if literal:  # what an LLM runner reads: get_max_seq_len, get_max_batch_size, …
            info.metadata["constant_methods"] = literal
        if program.named_data:
            info.metadata["named_data"] = program.named_data
        if program.inline_delegate_bytes:
            info.metadata["data_bytes"]["inline delegate payloads"] = program.inline_delegate_bytes
        constants = [c for m in program.methods for c in m.constants]
        if constants:
            info.add_tensors(
                (c.name or f"constant {i}", c.dtype, list[int | str](c.sizes), math.prod(c.sizes))
                for i, c in enumerate(constants)
            )
        info.quantized = _quantization(program.methods)
        if any(isinstance(t, PteTensor) and t.dynamism != "static" for t in forward.inputs):
            info.notes.append(
                "dynamic inputs: their sizes are the upper bounds ExecuTorch planned memory "
                "for; it refuses larger ones"
            )
        if delegates:
            info.notes.append(
                f"delegate calls run on {', '.join(delegates)}: backends compiled into the "
                "runtime, which interpret the payloads in the file (data, not code)"
            )
        return info

    def open(self, path: Path, device: str = "cpu") -> Program:
        require_installed("executorch")  # said here, not in the child
        forward = forward_of(read_program(path))
        runtime = IsolatedRuntime(self.name, str(path), device, load=load_runtime)
        names = forward.input_names
        signature = None if names is None else Signature(names, list(names), source="pte inputs")
        dynamic = any(isinstance(t, PteTensor) and t.dynamism != "static" for t in forward.inputs)
        first = next((t for t in forward.inputs if isinstance(t, PteTensor) and t.sizes), None)
        return Program(
            runtime,
            signature,
            dynamic=dynamic,
            max_batch=first.sizes[0] if dynamic and first is not None else None,
        )


# constants of these dtypes are quantized values: the q* always, 8-bit integers beside quantized
# ops (a delegate's quantized weights are in its payload, which is not read)
_QUANTIZED_DTYPES = ("qint8", "quint8", "qint32", "quint4x2", "quint2x4")
_BYTE_DTYPES = ("int8", "uint8")


def _quantization(methods: list[PteMethod]) -> Quantization | None:
    """The quantized kernels the methods call (``quantized_decomposed::dequantize_per_channel``,
    …) and their quantized constants by dtype; None when there is neither."""
    ops = Counter[str]()
    for m in methods:
        ops.update({op: n for op, n in m.portable_ops.items() if "quantize" in op.lower()})
    kinds = _QUANTIZED_DTYPES + (_BYTE_DTYPES if ops else ())
    weights = Counter(c.dtype for m in methods for c in m.constants if c.dtype in kinds)
    if not ops and not weights:
        return None
    return Quantization(dict(ops.most_common()), dict(sorted(weights.items())))


def _one(values: list[Any]) -> Any:
    return values[0] if len(values) == 1 else values


def constant_methods(path: Path) -> dict[str, Any]:
    """The program's constant methods by name, each its value (a list when it returns several)."""
    return {m.name: _one(m.returns) for m in read_program(path).methods if m.returns is not None}


def _method_words(m: PteMethod) -> dict[str, Any]:
    def words(t: PteTensor | str) -> str:
        if isinstance(t, str):
            return t
        bound = " (upper bounds)" if t.dynamism != "static" else ""
        return f"{t.dtype}[{', '.join(map(str, t.sizes))}]{bound}"

    return {
        "inputs": [words(t) for t in m.inputs],
        "outputs": [words(t) for t in m.outputs],
        "delegate_calls": m.delegates,
        "portable_ops": m.portable_ops,
        "instructions": m.instructions,
        "planned_memory_bytes": m.planned_bytes,
    }
