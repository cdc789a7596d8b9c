"""Seq2seq LMs to ONNX as optimum lays them out (its default export: the decoder in two files
and merged into a third):

- ``encoder_model.onnx``: ``input_ids``, ``attention_mask`` → ``last_hidden_state``;
- ``decoder_model.onnx`` (the first step): ``input_ids``, ``encoder_attention_mask``,
  ``encoder_hidden_states`` → ``logits``, ``present.N.decoder.key|value``,
  ``present.N.encoder.key|value``;
- ``decoder_with_past_model.onnx`` (every later step): ``input_ids``,
  ``encoder_attention_mask``, ``past_key_values.N.decoder.key|value``,
  ``past_key_values.N.encoder.key|value`` → ``logits``, ``present.N.decoder.key|value`` (the
  encoder's keys and values do not change: they are fed back as they came from the first step);
- ``decoder_model_merged.onnx``: the two under one ``If`` on ``use_cache_branch``, their weights
  stored once (``merged.py``), which optimum's ``ORTModelForSeq2SeqLM`` loads first.

Whisper's, as optimum lays them out: ``encoder_model.onnx`` takes ``input_features`` (its frames
fixed, the batch dynamic) and the decoders no ``encoder_attention_mask``.

Dims are named ``batch_size``, ``encoder_sequence_length``, ``decoder_sequence_length``,
``past_decoder_sequence_length``. The decoders are the model's own forward given the encoder's
states (``seq2seq.decoder_logits``), exported by torch.export and the project's ONNX step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ptconvert import _compat
from ptconvert.errors import UnsupportedConversionError
from ptconvert.formats.onnx.options import OnnxOptions
from ptconvert.generation.loading import cache_layers, returned_cache
from ptconvert.generation.seq2seq import (
    check_features,
    cross_and_self_shapes,
    decoder_logits,
    encoder_example,
    encoder_inputs,
    encoder_module,
    is_speech,
    read_start_token,
    start_ids,
    start_token,
    write_configs,
)
from ptconvert.generation.seq2seq_folder import (
    CONFIGS,
    DECODER_ONNX,
    ENCODER_ONNX,
    MERGED_ONNX,
    WITH_PAST_ONNX,
)
from ptconvert.generation.tasks import folder_task
from ptconvert.options import Options

PAST = "past_key_values.{}.{}.{}"
PRESENT = "present.{}.{}.{}"
PAST_LENGTH = "past_decoder_sequence_length + decoder_sequence_length"


def _names(template: str, layers: int, parts: tuple[str, ...]) -> list[str]:
    return [
        template.format(i, p, k) for i in range(layers) for p in parts for k in ("key", "value")
    ]


def _first_step(model: Any, masked: bool = True) -> Any:
    import torch
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, encoder_attention_mask: Any, states: Any) -> Any:
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            out = decoder_logits(self.model, input_ids, states, encoder_attention_mask, cache)
            made = returned_cache(out)
            own = cache_layers(made.self_attention_cache)
            cross = cache_layers(made.cross_attention_cache)
            present = [t for a, b in zip(own, cross, strict=True) for t in (*a, *b)]
            return (out.logits, *present)

    class Unmasked(Decoder):  # a speech model's: no encoder_attention_mask
        def forward(self, input_ids: Any, states: Any) -> Any:  # type: ignore[override]
            return super().forward(input_ids, None, states)

    return (Decoder() if masked else Unmasked()).eval()


def _later_step(model: Any, layers: int, masked: bool = True) -> Any:
    import torch
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    width = model.get_input_embeddings().embedding_dim

    class DecoderWithPast(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, encoder_attention_mask: Any, *past: Any) -> Any:
            own = [(past[4 * i], past[4 * i + 1]) for i in range(layers)]
            cross = [(past[4 * i + 2], past[4 * i + 3]) for i in range(layers)]
            # the cross-attention keys and values come from the past: the encoder's states are
            # not read, only their shape (zeros of it)
            positions = (
                tuple(encoder_attention_mask.shape)
                if encoder_attention_mask is not None
                else (past[2].shape[0], past[2].shape[2])
            )
            states = past[2].new_zeros((*positions, width))
            cache = EncoderDecoderCache(DynamicCache(own), DynamicCache(cross))
            out = decoder_logits(self.model, input_ids, states, encoder_attention_mask, cache)
            present = [t for pair in cache_layers(returned_cache(out).self_attention_cache)
                       for t in pair]  # fmt: skip
            return (out.logits, *present)

    class Unmasked(DecoderWithPast):  # a speech model's: no encoder_attention_mask
        def forward(self, input_ids: Any, *past: Any) -> Any:
            return super().forward(input_ids, None, *past)

    return (DecoderWithPast() if masked else Unmasked()).eval()


def export_seq2seq_onnx(model: Any, folder: Path, opts: Options) -> list[str]:
    """The three graphs into ``folder``, each checked with onnx.checker; notes for the report."""
    import torch

    from ptconvert.deps import require

    require("onnx")
    require("onnxscript")
    if opts.of(OnnxOptions).external_data:
        raise UnsupportedConversionError(
            "--external-data is not there yet for generation exports", path=folder
        )
    own, cross = cross_and_self_shapes(model)
    layers = len(own) // 2
    speech = is_speech(model)
    batch, new, seen = 2, 3, 5
    dyn = torch.export.Dim.DYNAMIC
    inputs = encoder_example(model, batch, 7)
    mask = inputs.get("attention_mask")
    encoder = encoder_module(model)
    with torch.no_grad():
        states = encoder(**inputs)
    source = states.shape[1]  # a speech encoder's: fixed by its frames
    new_ids = torch.zeros((batch, new), dtype=torch.long)
    past: list[Any] = []
    for i in range(layers):
        # one tensor each: inputs that alias one another export as one
        past += [torch.randn((batch, own[2 * i + k][1], seen, own[2 * i + k][3])) for k in (0, 1)]
        past += [torch.randn((batch, cross[2 * i + k][1], source, cross[2 * i + k][3]))
                 for k in (0, 1)]  # fmt: skip
    both = {0: dyn, 1: dyn}
    # a speech model's encoder positions are fixed: its states and cross keys only batch-dynamic
    sources = {0: dyn} if speech else both
    cross_dims = {0: dyn} if speech else {0: dyn, 2: dyn}
    axes = {
        "input_features": "feature_size",
        "attention_mask": "encoder_sequence_length",
        "last_hidden_state": "encoder_sequence_length",
        "encoder_attention_mask": "encoder_sequence_length",
        "encoder_hidden_states": "encoder_sequence_length",
        "logits": "decoder_sequence_length",
    }
    presents = _names(PRESENT, layers, ("decoder", "encoder"))
    pasts = _names(PAST, layers, ("decoder", "encoder"))
    later = _names(PRESENT, layers, ("decoder",))
    for name in presents:
        axes[name] = "decoder_sequence_length" if ".decoder." in name else "encoder_sequence_length"
    for name in pasts:
        axes[name] = "past_decoder_sequence_length" if ".decoder." in name else (
            "encoder_sequence_length")  # fmt: skip
    source_ids = {**axes, "input_ids": "encoder_sequence_length"}
    target_ids = {**axes, "input_ids": "decoder_sequence_length"}
    masks = [] if speech else [mask]  # Whisper's decoders take no encoder_attention_mask
    mask_names = [] if speech else ["encoder_attention_mask"]
    graphs = [
        (ENCODER_ONNX, encoder, tuple(inputs.values()), tuple(sources for _ in inputs),
         list(inputs), ["last_hidden_state"], source_ids),
        (DECODER_ONNX, _first_step(model, not speech), (new_ids, *masks, states),
         (both, *(both for _ in masks), sources),
         ["input_ids", *mask_names, "encoder_hidden_states"], ["logits", *presents], target_ids),
        (WITH_PAST_ONNX, _later_step(model, layers, not speech), (new_ids, *masks, *past),
         (both, *(both for _ in masks),
          tuple({0: dyn, 2: dyn} if ".decoder." in n else cross_dims for n in pasts)),
         ["input_ids", *mask_names, *pasts], ["logits", *later],
         {**target_ids, **dict.fromkeys(later, PAST_LENGTH)}),
    ]  # fmt: skip
    notes: list[str] = []
    if _compat.hf.attn_implementation(model.config) != "eager":
        # the exporter's decomposition of SDPA followed by a reshape fails on T5, after seconds
        # of work: every seq2seq folder is exported with the model's eager attention (the same
        # numbers but at masked positions, which no generated token reads)
        model.set_attn_implementation("eager")
        notes.append("exported with eager attention (SDPA does not export to ONNX for all)")
    opset = _export_all(graphs, folder, opts)
    return [
        *notes,
        f"ONNX opset {opset}, checked with onnx.checker; {ENCODER_ONNX}, {DECODER_ONNX} (the "
        f"first step) and {WITH_PAST_ONNX} (every later one), {layers} decoder layers of "
        "past_key_values.N.decoder|encoder.key|value (optimum's names and files)",
    ]


def export_folder(
    model: Any, src: Path, tmp: Path, out: Path, opts: Options, notes: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The three graphs into the folder ``tmp``, with the model's configs; the report's cache
    and interface, read back from the written graphs (``src`` and ``out``: an AOTI package's,
    ``targets.Target``)."""
    from ptconvert import progress

    start = start_token(model)
    source = encoder_inputs(model)
    with progress.step("exporting the encoder and the decoders to ONNX"):
        notes.extend(export_seq2seq_onnx(model, tmp, opts))
    with progress.step(f"merging the decoders into {MERGED_ONNX}"):
        notes.append(merge_note(tmp))
    import onnx

    graphs: dict[str, Any] = {}
    for name in (ENCODER_ONNX, DECODER_ONNX, WITH_PAST_ONNX, MERGED_ONNX):
        graph = onnx.load(str(tmp / name), load_external_data=False).graph
        graphs[name] = {"inputs": [i.name for i in graph.input],
                        "outputs": [o.name for o in graph.output]}  # fmt: skip
    layers = sum(1 for n in graphs[WITH_PAST_ONNX]["inputs"] if n.startswith("past")) // 4
    interface = {
        "call": f"{ENCODER_ONNX}({source}) once, {DECODER_ONNX} on decoder_start_token_id "
        f"{start}, "
        f"{WITH_PAST_ONNX} a token a step (its present.N.decoder fed back as past, the "
        "first step's present.N.encoder as they are); or "
        f"{MERGED_ONNX} for both, use_cache_branch [false] on the first step (every past 0 "
        "positions) and [true] after",
        "files": {**graphs, **{name: {} for name in CONFIGS}},
        "decoder_start_token_id": start,
    }
    cache = {"kind": "inputs", "layers": layers,
             "past": PAST.format("N", "decoder|encoder", "key|value"),
             "present": PRESENT.format("N", "decoder|encoder", "key|value")}  # fmt: skip
    write_configs(model, tmp)
    return cache, interface


def merge_note(folder: Path) -> str:
    """The merged decoder written beside the split ones in ``folder``; the report's note."""
    from ptconvert.formats.onnx.generation.merged import merge_decoders

    split = [folder / DECODER_ONNX, folder / WITH_PAST_ONNX]
    counts = merge_decoders(split[0], split[1], folder / MERGED_ONNX)
    sizes = [p.stat().st_size for p in split]
    mb = 1 << 20
    return (
        f"{MERGED_ONNX}: both decoders under one If on use_cache_branch (optimum's merged "
        f"decoder), {counts['weights']} weights stored once ({counts['shared']} of them "
        f"shared by both, {counts['shared_bytes'] / mb:.1f} MiB); "
        f"{(folder / MERGED_ONNX).stat().st_size / mb:.1f} MiB against "
        f"{sizes[0] / mb:.1f} + {sizes[1] / mb:.1f} MiB for the split two"
    )


def read_folder(path: Path) -> dict[str, Any]:
    """What an ONNX folder says of itself: the task of its config.json (``folder_task``)."""
    return {"task": folder_task(path)}


def open_folder(path: Path, trust: bool) -> OnnxSeq2Seq:
    """The stepper of an ONNX folder (``trust``: an AOTI package's, ``targets.Target``)."""
    return OnnxSeq2Seq(path)


def _export_all(graphs: list[Any], folder: Path, opts: Options) -> Any:
    opset = None
    for name, module, args, dims, inputs, outputs, named in graphs:
        opset = _export_one(module, args, dims, (inputs, outputs, named), folder / name, opts)
    return opset


def _export_one(
    module: Any,
    args: tuple[Any, ...],
    dims: Any,
    names: tuple[list[str], list[str], dict[str, str]],
    path: Path,
    opts: Options,
) -> Any:
    """One graph exported, its inputs and outputs named ``names`` (inputs, outputs, the name of
    each one's second dim, or third for keys and values), written to ``path`` and checked."""
    import torch

    from ptconvert.convert.exporting import export_in_mode, wrapper_mode
    from ptconvert.formats.onnx.edges.export import _export, _reason, _rename_dims
    from ptconvert.formats.onnx.generation.past import _with_dim, save_checked

    try:
        with torch.no_grad():
            ep = export_in_mode(module, args, None, dims, wrapper_mode(opts.strict))
        program = _export(ep, opts)
    except Exception as exc:
        raise UnsupportedConversionError(
            f"{path.name} does not export to ONNX: {_reason(exc)}", path=path
        ) from None
    graph = program.model.graph
    inputs, outputs, axes = names
    symbols: dict[str, str] = {}
    for value, name in zip([*graph.inputs, *graph.outputs], [*inputs, *outputs], strict=True):
        value.name = name
        labels = ("batch_size", axes[name]) if name[:2] not in ("pa", "pr") else (
            "batch_size", "", axes[name])  # fmt: skip
        for dim, label in zip(value.shape or (), labels, strict=False):
            text = getattr(dim, "value", None)
            if label and isinstance(text, str) and text.isidentifier():
                symbols.setdefault(text, label)
    _rename_dims(program.model, symbols)
    for value in graph.outputs:
        if axes[value.name] == PAST_LENGTH:  # one spelling: past + new positions
            value.shape = _with_dim(value.shape, 2, PAST_LENGTH)
    return save_checked(program, path)


class OnnxSeq2Seq:
    """A folder of the graphs, run by onnxruntime: the encoder once, then the decoder a token a
    step, as optimum's ``ORTModelForSeq2SeqLM`` runs it: ``decoder_model_merged.onnx`` where it
    is there (``use_cache_branch`` false on the start token, every past of 0 positions, then
    true), else ``decoder_model`` on the start token and ``decoder_with_past_model`` after (a
    folder written before the merged file was). The decoder presents are fed back, the first
    step's encoder presents as they are. ``cross_check`` (the conversion's check) runs the split
    decoder of each step too, on the same inputs, and raises where the two differ. Whisper's
    encoder takes ``input_features`` (3-D float, its shape read from the graph) and its
    decoders no mask."""

    def __init__(self, folder: Path) -> None:
        from ptconvert.deps import require

        ort = require("onnxruntime")

        def session(name: str) -> Any:
            return ort.InferenceSession(str(folder / name), providers=["CPUExecutionProvider"])

        self.encoder = session(ENCODER_ONNX)
        self.first = session(DECODER_ONNX)
        self.later = session(WITH_PAST_ONNX)
        self.merged = session(MERGED_ONNX) if (folder / MERGED_ONNX).is_file() else None
        self.cross_check = False
        self.cross_checked: list[float] = []  # each step's largest difference
        self.past_names = [i.name for i in self.later.get_inputs() if i.name.startswith("past")]
        self.start_id = read_start_token(folder)
        first = self.encoder.get_inputs()[0]
        self.features = tuple(first.shape[1:]) if first.name == "input_features" else None
        self.input_rank = 3 if self.features else 2
        self.masked = any(i.name == "encoder_attention_mask" for i in self.first.get_inputs())
        self.path = folder
        self.mask: Any = None
        self.states: Any = None
        self.past: dict[str, Any] = {}

    def prefix(self, input_ids: Any) -> Any:
        return start_ids(input_ids, self.start_id)

    def cross_note(self) -> str | None:
        """What ``cross_check`` found, for the report; None where it compared nothing."""
        if not self.cross_checked:
            return None
        return (
            f"{MERGED_ONNX}: both branches checked against {DECODER_ONNX} and "
            f"{WITH_PAST_ONNX} at each of {len(self.cross_checked)} steps (outputs within "
            f"{max(self.cross_checked):.3g}); the generation check ran the merged decoder"
        )

    def _masked(self, feed: dict[str, Any]) -> dict[str, Any]:
        return {**feed, "encoder_attention_mask": self.mask} if self.masked else feed

    def _decode(self, split: Any, feed: dict[str, Any], use_cache: bool) -> Any:
        """One decoder step: the merged decoder's branch (else the split decoder) on ``feed``,
        its presents kept as the next step's pasts (the encoder's from the first step only);
        the last position's logits."""
        import numpy as np
        import torch

        if self.merged is None:
            results = _outputs(split, feed)
        else:
            merged_feed = {**feed, "encoder_hidden_states": self.states,
                           "use_cache_branch": np.array([use_cache])}  # fmt: skip
            if not use_cache:  # optimum's first step: every past of 0 positions
                merged_feed.update(_empty_pasts(self.merged, self.states))
            results = _outputs(self.merged, merged_feed)
            if self.cross_check:
                from ptconvert.formats.onnx.generation.merged import compare_branch

                error = compare_branch(results, _outputs(split, feed), use_cache, self.path)
                self.cross_checked.append(error)
        for name in self.past_names:
            present = name.replace("past_key_values.", "present.")
            if present in results and not (use_cache and ".encoder." in name):
                self.past[name] = results[present]
        return torch.from_numpy(results["logits"][:, -1].copy())

    def start(self, input_ids: Any, max_new_tokens: int) -> Any:
        import numpy as np

        if self.features is not None:
            check_features(input_ids, self.features, self.path)
            self.mask = None
            source = {"input_features": input_ids.numpy().astype(np.float32)}
        else:
            ids = input_ids.numpy().astype(np.int64)
            self.mask = np.ones_like(ids)
            source = {"input_ids": ids, "attention_mask": self.mask}
        (self.states,) = self.encoder.run(["last_hidden_state"], source)
        self.past = {}
        start = self.prefix(input_ids).numpy().astype(np.int64)
        feed = self._masked({"input_ids": start, "encoder_hidden_states": self.states})
        return self._decode(self.first, feed, use_cache=False)

    def step(self, tokens: Any) -> Any:
        import numpy as np

        feed = self._masked({"input_ids": tokens.numpy().astype(np.int64)})
        return self._decode(self.later, {**feed, **self.past}, use_cache=True)


def _outputs(session: Any, feed: dict[str, Any]) -> dict[str, Any]:
    """``session`` run on the part of ``feed`` it takes: its outputs by name."""
    taken = {i.name for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    run = session.run(names, {k: v for k, v in feed.items() if k in taken})
    return dict(zip(names, run, strict=True))


def _empty_pasts(session: Any, states: Any) -> dict[str, Any]:
    """Every past input of ``session`` as zeros of 0 positions (heads and head size read from
    the graph; the batch and dtype of the encoder's ``states``), as optimum feeds a merged
    decoder's first step."""
    import numpy as np

    return {
        i.name: np.zeros((states.shape[0], i.shape[1], 0, i.shape[3]), states.dtype)
        for i in session.get_inputs()
        if i.name.startswith("past_key_values.")
    }
