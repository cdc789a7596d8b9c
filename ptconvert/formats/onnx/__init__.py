"""ONNX models: a protobuf ModelProto, possibly with tensors in external data files.

Detection looks at the protobuf's first fields (``ir_version`` then a ModelProto field tag); a
folder holding ``model.onnx`` beside ``config.json`` is optimum's layout (layout ``folder``: what
``ORTModelFor<Task>.from_pretrained`` loads), its graph read, opened and described as the file;
``info`` parses the proto with the onnx package (the ``onnx`` extra) without loading external
data, and lists the external files the initializers point to.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ptconvert.deps import extra_hint, require, require_installed
from ptconvert.errors import CorruptFileError
from ptconvert.formats.base import (
    FileInfo,
    Format,
    IOSpec,
    Need,
    Probe,
    file_entry,
    installed,
)
from ptconvert.formats.isolated import IsolatedRuntime
from ptconvert.formats.onnx.options import OnnxOptions
from ptconvert.formats.onnx.quantized import quantization
from ptconvert.formats.onnx.runtime import load as load_runtime
from ptconvert.formats.program import Program, Signature
from ptconvert.formats.reference import Ref, Reference, torch_ref
from ptconvert.formats.weightset import WeightEntry, WeightSet

# ModelProto field tags that may follow ir_version (field 1): producer_name … opset_import.
_NEXT_FIELD_TAGS = frozenset({0x12, 0x1A, 0x22, 0x28, 0x32, 0x3A, 0x42, 0x72, 0x7A})

# onnx.TensorProto.DataType → torch dtype name
ONNX_DTYPES: dict[int, str] = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    8: "string",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
    14: "complex64",
    15: "complex128",
    16: "bfloat16",
    17: "float8_e4m3fn",
    18: "float8_e4m3fnuz",
    19: "float8_e5m2",
    20: "float8_e5m2fnuz",
}


def _exporter(opts: Any) -> str:
    return str(opts.of(OnnxOptions).onnx_exporter)


def is_onnx(head: bytes) -> bool:
    """A ModelProto's first bytes: ir_version (field 1, a varint), then a string field."""
    return len(head) >= 3 and head[0] == 0x08 and head[1] < 0x20 and head[2] in (0x12, 0x1A, 0x3A)


class OnnxFormat(Format):
    name = "onnx"
    suffixes = (".onnx",)
    holds = "an ONNX graph with initializers (optionally in external data files)"
    priority = 10
    kind = "program"
    isolated = True
    takes_leaves = True  # the exporter flattens nested inputs (feats_image, extra_0)
    packages = ("onnx", "onnxruntime", "onnxscript")
    extra = "onnx"
    options_class = OnnxOptions
    # onnxruntime's CPU kernels have no bfloat16 Gemm, MatMul, Softmax …: such a graph does not
    # load where it is checked and deployed
    dtypes = ("float32", "float16")
    dtypes_why = "onnxruntime's CPU kernels lack bfloat16 for most ops (Gemm, MatMul)"
    # onnxruntime's quantize_dynamic on the written graph (edges/quantize.py)
    quantize_schemes = ("int8",)
    needs = (
        Need(
            "onnx",
            extra_hint("onnx") + ": onnx, onnxscript and onnxruntime",
            installed("onnx", "onnxscript", "onnxruntime", "onnx_ir"),
        ),
        # --onnx-exporter picks one of the two edges to onnx: an explicit choice, never a
        # fallback from one exporter to the other
        Need(
            "onnx_dynamo_exporter",
            "pass --onnx-exporter dynamo (the default): TorchScript's exporter traces a module, "
            "and this route holds a program",
            lambda f, o: _exporter(o) == "dynamo",
        ),
        Need(
            "onnx_torchscript_exporter",
            "pass --onnx-exporter torchscript",
            lambda f, o: _exporter(o) == "torchscript",
        ),
    )
    load_line = "import onnxruntime\nsess = onnxruntime.InferenceSession(p)"
    folder_file = "model.onnx"  # optimum's name for the graph in its folder
    folder_client = "optimum's ORTModelFor<Task>.from_pretrained"
    folder_load_line = (  # sess: what the call line runs
        "import onnxruntime\nsess = onnxruntime.InferenceSession(f'{p}/model.onnx')"
        "  # optimum: ORTModelFor<Task>.from_pretrained(p)"
    )

    def graph_file(self, path: Path) -> Path:
        """The graph itself: ``path``, or the one in the folder it names."""
        return path / self.folder_file if path.is_dir() else path

    def weights_file(self, path: Path) -> Path | None:
        return self.graph_file(path) if path.is_dir() else None

    def companions(self, path: Path) -> list[Path]:
        return [path.with_name(f"{path.name}.data")]

    def call_line(self, args: str) -> str:
        feeds = ", ".join(f'"{a.strip().removesuffix("=…")}": …' for a in args.split(","))
        return f"sess.run(None, {{{feeds}}})"

    def open(self, path: Path, device: str = "cpu") -> Program:
        # onnxruntime runs in its own process (it may crash or leak); external data stays in
        # the model's folder
        require_installed("onnxruntime")  # said here, not in the child
        path = self.graph_file(path)
        declared = self.info(path, "protobuf").inputs or []
        runtime = IsolatedRuntime(
            self.name, str(path), device, load=load_runtime, flat=self.takes_leaves
        )
        names = runtime.input_names
        signature = None if names is None else Signature(names, list(names), source="ONNX inputs")
        # a graph whose inputs all have a fixed first dim takes that batch size only
        dynamic = any(not s.shape or not isinstance(s.shape[0], int) for s in declared)
        return Program(runtime, signature, dynamic=dynamic, input_specs=declared)

    def match(self, probe: Probe) -> str | None:
        if probe.is_dir:
            graph = probe.path / self.folder_file
            if not (probe.path / "config.json").is_file() or not graph.is_file():
                return None
            return "folder" if self.match(Probe(graph)) else None
        h = probe.head
        if len(h) >= 3 and h[0] == 0x08 and h[1] < 0x20 and h[2] in _NEXT_FIELD_TAGS:
            return "protobuf"
        return None

    read_label = "the initializers, by torch name"
    read_needs = ("onnx",)

    def read_weights(
        self, path: Path, layout: str, key: str | None, skip_unsupported: bool
    ) -> WeightSet:
        return read_onnx_weights(path)

    def reference(self, ws: WeightSet, may_load: Callable[[], bool], stack: ExitStack) -> Reference:
        assert ws.origin is not None
        return onnx_reference(ws.origin)

    def holds_no_pickle(self, head: bytes, path: Path) -> bool:
        return is_onnx(head)

    def info(self, path: Path, layout: str) -> FileInfo:
        if layout == "folder":
            return self._folder_info(path)
        onnx = require("onnx")
        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as exc:  # protobuf raises its own DecodeError types
            raise CorruptFileError(f"not a valid ONNX model ({exc})", path=path) from None
        info = FileInfo(str(path), self.name, layout, path.stat().st_size, [file_entry(path)])
        graph = model.graph
        init_names = {t.name for t in graph.initializer}
        info.inputs = [_value_info(v) for v in graph.input if v.name not in init_names]
        info.outputs = [_value_info(v) for v in graph.output]
        info.opset = {(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import}
        ops: Counter[str] = Counter()
        external: set[str] = set()
        entries: list[tuple[str, str, list[int | str], int]] = []
        for t, where in _weights(graph, ops):
            dims = [int(d) for d in t.dims]
            dtype = ONNX_DTYPES.get(t.data_type, str(t.data_type))
            entries.append((where + (t.name or "?"), dtype, list[int | str](dims), math.prod(dims)))
            for kv in t.external_data:
                if kv.key == "location":
                    external.add(kv.value)
        info.metadata = {
            "ir_version": int(model.ir_version),
            "producer": f"{model.producer_name} {model.producer_version}".strip(),
            "nodes": sum(ops.values()),
            "ops": dict(ops.most_common()),
        }
        info.add_tensors(entries)
        # initializers of the main graph by name: the weights its quantized operators take
        dtypes = {t.name: ONNX_DTYPES.get(t.data_type, str(t.data_type)) for t in graph.initializer}
        info.quantized = quantization(graph, ops, dtypes)
        held = [e for e in entries if e[0].startswith(("Constant ", "subgraph "))]
        if held:
            info.notes.append(
                f"{len(held)} tensor(s) with {sum(e[3] for e in held)} values are held in Constant "
                "nodes or subgraphs (If/Loop/Scan bodies), not in the graph's initializers"
            )
        for name in sorted(external):
            ext = path.parent / name
            if ext.exists():
                info.files.append(file_entry(ext))
                info.size_bytes += ext.stat().st_size
            else:
                info.notes.append(f"external data file {name!r} is missing")
        return info

    def _folder_info(self, path: Path) -> FileInfo:
        """The folder's graph as the file's, with the folder's other files."""
        info = self.info(path / self.folder_file, "protobuf")
        listed = {f["path"] for f in info.files}
        others = [p for p in sorted(path.iterdir()) if p.is_file() and str(p) not in listed]
        info.files += [file_entry(p) for p in others]
        info.path, info.layout = str(path), "folder"
        info.size_bytes = sum(f["size_bytes"] for f in info.files)
        info.notes.append(
            f"a folder as {self.folder_client} loads it: {self.folder_file} beside "
            + ", ".join(p.name for p in others if p.name != f"{self.folder_file}.data")
        )
        return info


def _weights(graph: Any, ops: Counter[str], depth: int = 0) -> Iterator[tuple[Any, str]]:
    """Every tensor of the graph with where it is held: initializers, ``Constant`` nodes'
    values, and the same inside subgraphs (the bodies of If, Loop and Scan). Counts the ops."""
    from onnx import AttributeProto

    inner = "subgraph " if depth else ""
    for t in graph.initializer:
        yield t, inner
    for node in graph.node:
        ops[node.op_type if not node.domain else f"{node.domain}.{node.op_type}"] += 1
        for attr in node.attribute:
            if node.op_type == "Constant" and attr.type == AttributeProto.TENSOR:
                t = attr.t
                if not t.name:
                    t.name = node.output[0] if node.output else node.name
                yield t, inner or "Constant "
            if attr.type == AttributeProto.GRAPH:
                yield from _weights(attr.g, ops, depth + 1)
            elif attr.type == AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _weights(g, ops, depth + 1)


def _value_info(v: Any) -> IOSpec:
    tt = v.type.tensor_type
    dims: list[int | str] = [
        d.dim_param
        if d.HasField("dim_param")
        else int(d.dim_value)
        if d.HasField("dim_value")
        else "?"  # a dim the model leaves unnamed and unknown
        for d in tt.shape.dim
    ]
    return IOSpec(v.name, ONNX_DTYPES.get(tt.elem_type, str(tt.elem_type)), dims)


# names an exporter makes up for constants it created (folded values, shapes, scalars)
_GENERATED = re.compile(r"^(val_\d+|_?onnx::.*|.*_output_\d+|const(ant)?_.*|\d.*)$")


def read_onnx_weights(path: Path) -> WeightSet:
    """An ONNX model's initializers (external data included), under the names torch's exporter
    gave them: the parameters' own names. Constants the exporter made up are listed as left
    out, with their names."""
    import torch

    from ptconvert.deps import require

    ir = require("onnx_ir")
    try:
        model = ir.load(str(path))
    except Exception as exc:  # protobuf and file errors alike
        raise CorruptFileError(f"not a readable ONNX model ({exc})", path=path) from None
    entries: list[WeightEntry] = []
    skipped: dict[str, str] = {}
    for name, value in model.graph.initializers.items():
        tensor = value.const_value
        if tensor is None:
            continue
        if _GENERATED.match(name) or not _TORCH_NAME.match(name):
            skipped[name] = "a constant the exporter made, not a torch parameter name"
            continue
        dtype = ONNX_DTYPES.get(int(tensor.dtype), "")
        torch_dtype = getattr(torch, dtype, None)
        if torch_dtype is None:
            skipped[name] = f"ONNX data type {tensor.dtype} has no torch dtype"
            continue
        data = bytearray(tensor.tobytes())
        t = torch.frombuffer(data, dtype=torch_dtype) if data else torch.empty(0, dtype=torch_dtype)
        shape = tuple(int(d) for d in tensor.shape)
        entries.append(WeightEntry(name, dtype, shape, len(data), tensor=t.reshape(shape)))
    ws = WeightSet(entries, "torch", skipped=skipped)
    if skipped:
        ws.notes.append(
            f"{len(skipped)} initializer(s) without a torch parameter name were left out: "
            f"{sorted(skipped)[:10]}"
        )
    return ws


_TORCH_NAME = re.compile(r"^[A-Za-z_][\w]*(\.[\w]+)*$")


def onnx_reference(path: Path) -> Reference:
    """The onnx package's own reader (``onnx.load`` with external data, ``numpy_helper``):
    another implementation than the onnx_ir reader the conversion used."""
    import numpy as np
    import onnx
    import torch
    from onnx import numpy_helper

    model = onnx.load(str(path), load_external_data=True)
    tensors: dict[str, Ref] = {}
    for init in model.graph.initializer:
        array = np.ascontiguousarray(numpy_helper.to_array(init))
        dtype = getattr(torch, ONNX_DTYPES.get(init.data_type, ""), None)
        if dtype is None:
            continue
        if array.dtype.kind not in "biufc":  # bfloat16, float8 (ml_dtypes): by their bits
            t = torch.from_numpy(array.view(f"u{array.dtype.itemsize}")).view(dtype)
        else:
            t = torch.from_numpy(array)
        tensors[init.name] = torch_ref(t)
    return Reference("onnx.load + numpy_helper", tensors)
