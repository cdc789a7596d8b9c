"""ONNX decoders with their cache as optimum lays them out: inputs ``input_ids``,
``attention_mask``, ``position_ids`` (where the model takes them) and
``past_key_values.N.key|value``; outputs ``logits`` and ``present.N.key|value``; dims named
``batch_size``, ``sequence_length``, ``past_sequence_length`` and ``past_sequence_length +
sequence_length``. An empty past (length 0) starts generation.

The model is wrapped in a module that takes the past as flat tensors and builds a
``DynamicCache`` from them, exported by torch.export with every batch and length dim dynamic,
then by the project's ONNX step (``convert/onnx_export``: the exporter call, the dims renamed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ptconvert.errors import UnsupportedConversionError
from ptconvert.formats.onnx.options import OnnxOptions
from ptconvert.generation.loading import cache_keyword, cache_layers, returned_cache
from ptconvert.options import Options

PAST = "past_key_values.{}.{}"
PRESENT = "present.{}.{}"


def _takes_positions(model: Any) -> bool:
    import inspect

    return "position_ids" in inspect.signature(model.forward).parameters


def _wrapper(model: Any, layers: int, positions: bool) -> Any:
    import torch
    from transformers.cache_utils import DynamicCache

    keyword = cache_keyword(model)

    class WithPast(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, *rest: Any) -> Any:
            position_ids, past = (rest[0], rest[1:]) if positions else (None, rest)
            pairs = [(past[2 * i], past[2 * i + 1]) for i in range(layers)]
            extra = {"position_ids": position_ids} if positions else {}
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                use_cache=True,
                **extra,
                **{keyword: DynamicCache(pairs)},
            )
            present = [t for pair in cache_layers(returned_cache(out)) for t in pair]
            return (out.logits, *present)

    return WithPast().eval()


def cache_shapes(model: Any) -> list[tuple[int, ...]]:
    """The shape of each layer's keys and values (batch 1, one position), from a call."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.zeros((1, 1), dtype=torch.long), use_cache=True)
    return [tuple(t.shape) for pair in cache_layers(returned_cache(out)) for t in pair]


def export_decoder_onnx(model: Any, path: Path, opts: Options) -> list[str]:
    """Write the decoder with past inputs and present outputs to ``path`` (onnx.checker run on
    it); returns notes for the report."""
    import torch

    from ptconvert.deps import require
    from ptconvert.formats.onnx.edges.export import _export, _reason, _rename_dims

    require("onnx")
    traced = opts.of(OnnxOptions).onnx_exporter == "torchscript"
    if not traced:  # the dynamo exporter's translations (0.65 s to import: not for a trace)
        require("onnxscript")
    if opts.of(OnnxOptions).external_data:
        raise UnsupportedConversionError(
            "--external-data is not there yet for generation exports", path=path
        )
    shapes = cache_shapes(model)
    layers = len(shapes) // 2
    positions = _takes_positions(model)
    batch, past, new = 2, 3, 4
    args: list[Any] = [
        torch.zeros((batch, new), dtype=torch.long),
        torch.ones((batch, past + new), dtype=torch.long),
    ]
    if positions:
        args.append(torch.arange(past, past + new).expand(batch, new).contiguous())
    args += [torch.zeros((batch, s[1], past, *s[3:])) for s in shapes]
    dyn = torch.export.Dim.DYNAMIC
    rest: list[Any] = [{0: dyn, 1: dyn}] if positions else []  # *rest: one tuple to export
    rest += [{0: dyn, 2: dyn}] * len(shapes)
    dims = ({0: dyn, 1: dyn}, {0: dyn, 1: dyn}, tuple(rest))
    wrapper = _wrapper(model, layers, positions)
    if traced:
        from ptconvert.formats.onnx.edges.trace import refuse_length_dependent

        refuse_length_dependent(model, path)
        return _traced(wrapper, args, layers, positions, path, opts)
    try:
        from ptconvert.convert.exporting import export_in_mode, wrapper_mode

        with torch.no_grad():
            ep = export_in_mode(wrapper, args, None, dims, wrapper_mode(opts.strict))
        program = _export(ep, opts)
    except Exception as exc:
        raise UnsupportedConversionError(
            f"the decoder with its cache does not export to ONNX: {_reason(exc)}", path=path
        ) from None
    names = _name(program.model, layers, positions)
    _rename_dims(program.model, names)
    for value in program.model.graph.outputs[1:]:  # one spelling: past + new positions
        value.shape = _with_dim(value.shape, 2, "past_sequence_length + sequence_length")
    opset = save_checked(program, path)
    return [
        f"ONNX opset {opset}, checked with onnx.checker; {layers} layers of past_key_values "
        "inputs and present outputs (optimum's names)"
    ]


def _traced(
    wrapper: Any, args: list[Any], layers: int, positions: bool, path: Path, opts: Options
) -> list[str]:
    """The decoder with past written by TorchScript's exporter (``--onnx-exporter
    torchscript``, as optimum-cli exports it): one trace at batch 2, 3 past and 4 new positions,
    the dims named in the call. The check by generating runs it from an empty past."""
    from ptconvert.formats.onnx.edges.export import check_written
    from ptconvert.formats.onnx.edges.trace import frozen_words, traced_to_onnx
    from ptconvert.generation.check import NEW_TOKENS, PROMPT_LENGTHS

    reach = f"{max(PROMPT_LENGTHS) + NEW_TOKENS} positions"

    inputs = ["input_ids", "attention_mask", *(["position_ids"] if positions else [])]
    inputs += [PAST.format(i, kind) for i in range(layers) for kind in ("key", "value")]
    outputs = ["logits"] + [PRESENT.format(i, k) for i in range(layers) for k in ("key", "value")]
    total = "past_sequence_length + sequence_length"
    plain = inputs[: 3 if positions else 2]
    axes = {n: {0: "batch_size", 1: "sequence_length"} for n in [*plain, "logits"]}
    axes["attention_mask"] = {0: "batch_size", 1: total}
    axes |= {n: {0: "batch_size", 2: "past_sequence_length"} for n in inputs if n[:4] == "past"}
    axes |= {n: {0: "batch_size", 2: total} for n in outputs[1:]}
    try:
        frozen = traced_to_onnx(
            wrapper, tuple(args), path, inputs, outputs, axes, opts.of(OnnxOptions).opset
        )
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise UnsupportedConversionError(
            f"TorchScript's ONNX exporter cannot export the decoder with its cache: "
            f"{type(exc).__name__}: {first}",
            path=path,
            hint="leave --onnx-exporter out (the dynamo exporter)",
        ) from None
    opset = check_written(path, path).opset
    return [
        f"ONNX opset {opset} from TorchScript's exporter (--onnx-exporter torchscript), checked "
        f"with onnx.checker; {layers} layers of past_key_values inputs and present outputs "
        "(optimum's names)"
        + frozen_words(frozen, f"the check generates from other prompt lengths, to {reach}")
    ]


def export_with_past(
    model: Any, src: Path, tmp: Path, out: Path, opts: Options, notes: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The decoder with past inputs into the ONNX file ``tmp`` (``export_decoder_onnx``); the
    report's cache and interface, read back from the written graph (``src`` and ``out``: an
    AOTI package's, ``targets.Target``)."""
    from ptconvert import progress

    with progress.step("exporting to ONNX with past_key_values inputs"):
        notes.extend(export_decoder_onnx(model, tmp, opts))
    import onnx

    graph = onnx.load(str(tmp), load_external_data=False).graph
    inputs = [i.name for i in graph.input]
    outputs = [o.name for o in graph.output]
    layers = sum(1 for n in inputs if n.startswith("past_key_values.")) // 2
    cache = {"kind": "inputs", "layers": layers, "past": PAST.format("N", "key|value"),
             "present": PRESENT.format("N", "key|value")}  # fmt: skip
    return cache, {"inputs": inputs, "outputs": outputs}


def _graph(path: Path) -> Path:
    """The decoder itself: ``path``, or the one in the folder optimum's ORTModelForCausalLM
    loads (config.json beside)."""
    from ptconvert.formats.onnx import OnnxFormat

    return OnnxFormat().graph_file(path)


def read_meta(path: Path) -> dict[str, Any] | None:
    """What an ONNX decoder with past inputs (or its folder) says of itself: its task; None
    for another graph (or one the onnx package cannot read)."""
    import onnx

    path = _graph(path)
    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # an unreadable file: whoever loads it says what is wrong
        return None
    if any(i.name.startswith("past_key_values.") for i in graph.input):
        return {"task": "text-generation-with-past"}
    return None


def open_decoder(path: Path, trust: bool) -> OnnxWithPast:
    """The stepper of an ONNX decoder with past inputs, or of its folder (``trust``: an AOTI
    package's, ``targets.Target``)."""
    return OnnxWithPast(_graph(path))


def save_checked(program: Any, path: Path) -> Any:
    """A generation graph written as one file (no external data) and run through
    ``onnx.checker``; its opset."""
    from ptconvert.formats.onnx.edges.export import check_written

    program.save(path, external_data=False)
    check_written(path, path)
    return program.model.opset_imports.get("")


def _with_dim(shape: Any, axis: int, name: str) -> Any:
    import onnx_ir as ir

    dims = list(shape)
    dims[axis] = ir.SymbolicDim(name)
    return ir.Shape(dims)


def _name(model: Any, layers: int, positions: bool) -> dict[str, str]:
    """The graph's inputs and outputs under optimum's names; torch's symbols (``s70``) → the
    dim names, read off the inputs' and outputs' shapes by position."""
    inputs = ["input_ids", "attention_mask", *(["position_ids"] if positions else [])]
    inputs += [PAST.format(i, kind) for i in range(layers) for kind in ("key", "value")]
    outputs = ["logits"] + [PRESENT.format(i, k) for i in range(layers) for k in ("key", "value")]
    axes = {
        "input_ids": ("batch_size", "sequence_length"),
        "attention_mask": ("batch_size", "past_sequence_length + sequence_length"),
        "position_ids": ("batch_size", "sequence_length"),
        "logits": ("batch_size", "sequence_length"),
    }
    symbols: dict[str, str] = {}
    for values, wanted in ((model.graph.inputs, inputs), (model.graph.outputs, outputs)):
        for value, name in zip(values, wanted, strict=True):
            value.name = name
            if name.startswith(("past", "present")):
                middle = "past_sequence_length" + (" + sequence_length" if name[:2] == "pr" else "")
                dim_names: tuple[str, ...] = ("batch_size", "", middle)
            else:
                dim_names = axes[name]
            for dim, label in zip(value.shape or (), dim_names, strict=False):
                text = getattr(dim, "value", None)
                if label and isinstance(text, str) and text.isidentifier():
                    symbols.setdefault(text, label)
    return symbols


class OnnxWithPast:
    """An ONNX decoder with past inputs, run by onnxruntime: the prompt with an empty past,
    then one token a step, each step's present fed back as the next past."""

    def __init__(self, path: Path) -> None:
        from ptconvert.deps import require

        ort = require("onnxruntime")
        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.past_names = [n for n in self.inputs if n.startswith("past_key_values.")]
        if "input_ids" not in self.inputs or not self.past_names:
            raise UnsupportedConversionError(
                "an ONNX model without input_ids and past_key_values.N.key|value inputs",
                path=path,
                hint="convert with --task text-generation-with-past",
            )
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.past: list[Any] = []
        self.length = 0

    def _run(self, ids: Any) -> Any:
        import numpy as np
        import torch

        rows, count = ids.shape
        feed: dict[str, Any] = {"input_ids": ids.numpy().astype(np.int64)}
        if "attention_mask" in self.inputs:
            feed["attention_mask"] = np.ones((rows, self.length + count), np.int64)
        if "position_ids" in self.inputs:
            feed["position_ids"] = np.tile(np.arange(self.length, self.length + count), (rows, 1))
        feed.update(zip(self.past_names, self.past, strict=True))
        results = dict(zip(self.outputs, self.session.run(self.outputs, feed), strict=True))
        self.past = [results[n.replace("past_key_values.", "present.")] for n in self.past_names]
        self.length += count
        return torch.from_numpy(results["logits"][:, -1].copy())

    def start(self, input_ids: Any, max_new_tokens: int) -> Any:
        import numpy as np

        rows = input_ids.shape[0]
        self.past = []
        for name in self.past_names:
            shape = self.inputs[name].shape
            heads, size = shape[1], shape[3]
            kind = np.float16 if "float16" in self.inputs[name].type else np.float32
            self.past.append(np.zeros((rows, heads, 0, size), kind))
        self.length = 0
        return self._run(input_ids)

    def step(self, tokens: Any) -> Any:
        return self._run(tokens)
