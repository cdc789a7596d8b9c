"""Seq2seq LMs (T5, BART, Marian) and speech seq2seq models (Whisper) as an encoder and a
decoder driven by a generation loop, written as a FOLDER (what ``ptconvert.generate`` and
``bench`` take):

- pt2: ``encoder.pt2`` (``input_ids``, ``attention_mask`` → ``last_hidden_state``; batch and
  length dynamic) and ``decoder.pt2`` with a static self-attention cache (``decoder_input_ids``
  of a fixed batch × 1 to N new tokens, ``encoder_hidden_states``, ``encoder_attention_mask``,
  ``cache_position`` → ``logits``; the cross-attention keys and values are computed from the
  encoder's states in every call), its ``generation.json`` holding the cache's batch and length;
- Whisper (``main_input_name`` ``input_features``): the encoder takes ``input_features``
  (batch × mel bins × ``2 * max_source_positions`` frames: only the batch is dynamic) and the
  decoder no ``encoder_attention_mask`` (optimum's Whisper layout); the rest as above;
- ONNX (the onnx target's ``generation/seq2seq.py``): optimum's ``encoder_model.onnx``,
  ``decoder_model.onnx`` and ``decoder_with_past_model.onnx``;
- both: the model's ``config.json`` and ``generation_config.json``.

The decoder is the model's own ``forward`` given ``encoder_outputs``: its final logits are
computed as the model computes them (T5 scales the decoder's output by ``d_model**-0.5`` before
its tied head, BART adds ``final_logits_bias``), which transformers' own exportable decoder
(``Seq2SeqLMDecoderExportableModuleWithStaticCache``: ``lm_head`` on the decoder's output)
does not do (Whisper's ``proj_out`` tied to its embeddings is its forward's too).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ptconvert.errors import UnsupportedConversionError, UsageError
from ptconvert.generation.loading import cache_keyword, cache_layers, returned_cache
from ptconvert.generation.seq2seq_folder import CONFIGS, DECODER_PT2, ENCODER_PT2
from ptconvert.options import ExportMode


def is_speech(model: Any) -> bool:
    """A speech seq2seq model (Whisper): its encoder takes ``input_features``."""
    return getattr(model, "main_input_name", "input_ids") == "input_features"


def feature_shape(model: Any) -> tuple[int, int]:
    """The mel bins and frames a speech encoder takes: Whisper's ``2 * max_source_positions``
    frames (its encoder refuses any other count)."""
    config = model.config
    return int(config.num_mel_bins), 2 * int(config.max_source_positions)


def encoder_example(model: Any, batch: int, length: int) -> dict[str, Any]:
    """The encoder's example inputs by name: ``input_ids`` and ``attention_mask`` of ``length``
    tokens, or a speech model's ``input_features`` (zeros of its fixed shape)."""
    import torch

    if is_speech(model):
        dtype = next(model.parameters()).dtype
        return {"input_features": torch.zeros((batch, *feature_shape(model)), dtype=dtype)}
    ids = torch.zeros((batch, length), dtype=torch.long)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def check_features(features: Any, shape: Any, path: Any) -> None:
    """A speech encoder's input: float, batch × ``shape`` (mel bins × frames), else a named
    error."""
    wrong = features.dim() != 3 or tuple(features.shape[1:]) != tuple(shape)
    if wrong or not features.is_floating_point():
        raise UsageError(
            f"the encoder takes input_features, float batch × {shape[0]} mel bins × {shape[1]} "
            f"frames; got {str(features.dtype).removeprefix('torch.')} "
            f"{list(features.shape)}",
            path=path,
            hint="pad or cut the log-mel features to the frames the model takes, as its "
            "feature extractor does",
        )


def start_token(model: Any) -> int:
    """The decoder's first token, as ``generate`` picks it."""
    start = model.generation_config.decoder_start_token_id
    if start is None:
        start = model.config.decoder_start_token_id
    if start is None:
        raise UnsupportedConversionError(
            f"{type(model).__name__} has no decoder_start_token_id (generation_config.json or "
            "config.json): the decoder cannot be started"
        )
    return int(start)


def start_ids(inputs: Any, start: int) -> Any:
    """The decoder's first input: ``start`` for each row of the encoder's inputs (token ids,
    or a speech model's features)."""
    import torch

    return torch.full((inputs.shape[0], 1), start, dtype=torch.long)


def encoder_meta(model: Any) -> dict[str, Any]:
    """What ``generation.json`` says of a speech encoder's input (the stepper checks it)."""
    if not is_speech(model):
        return {}
    return {"encoder_input": "input_features", "feature_shape": list(feature_shape(model))}


def write_configs(model: Any, folder: Path) -> None:
    """``config.json`` and ``generation_config.json`` as transformers writes them."""
    model.config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)


def read_start_token(folder: Path) -> int:
    """The decoder's first token from a written folder's configs."""
    for name in ("generation_config.json", "config.json"):
        try:
            raw = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(raw, dict) and isinstance(raw.get("decoder_start_token_id"), int):
            return int(raw["decoder_start_token_id"])
    raise UsageError(
        "the folder's generation_config.json and config.json give no decoder_start_token_id",
        path=folder,
    )


def cross_and_self_shapes(model: Any) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Each decoder layer's self-attention and cross-attention key/value shapes (batch 1, one
    decoder token, one encoder position), from an eager call."""
    import torch

    with torch.no_grad():
        out = model(
            **encoder_example(model, 1, 1),
            decoder_input_ids=torch.zeros((1, 1), dtype=torch.long),
            use_cache=True,
        )
    cache = returned_cache(out)
    own = [tuple(t.shape) for pair in cache_layers(cache.self_attention_cache) for t in pair]
    cross = [tuple(t.shape) for pair in cache_layers(cache.cross_attention_cache) for t in pair]
    return own, cross


def encoder_module(model: Any) -> Any:
    """The model's encoder: ``input_ids``, ``attention_mask`` (a speech model's
    ``input_features``) → its last hidden state."""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = model.get_encoder()

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask)[0]

    class SpeechEncoder(Encoder):
        def forward(self, input_features: Any) -> Any:  # type: ignore[override]
            return self.encoder(input_features=input_features)[0]

    return (SpeechEncoder() if is_speech(model) else Encoder()).eval()


def decoder_logits(model: Any, ids: Any, states: Any, mask: Any, cache: Any) -> Any:
    """The model's forward from the encoder's states: the decoder, then the model's own final
    logits computation (``mask`` None: a speech model's, which takes none)."""
    out = model(
        encoder_outputs=(states,),
        attention_mask=mask,
        decoder_input_ids=ids,
        use_cache=True,
        **{cache_keyword(model): cache},
    )
    return out


def static_decoder(model: Any, batch: int, length: int) -> Any:
    """The decoder with a static self-attention cache of ``batch`` × ``length`` positions kept
    in buffers the program mutates; the cross-attention cache is made anew in each call. A
    speech model's is called without ``encoder_attention_mask``."""
    import torch
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache, StaticCache

    own, _ = cross_and_self_shapes(model)
    heads = {s[1] for s in own}
    sizes = {s[3] for s in own}
    if len(heads) != 1 or len(sizes) != 1:
        raise UnsupportedConversionError(
            "decoder layers of different head counts or sizes: the static cache has one shape"
        )
    dtype = next(model.parameters()).dtype
    device = next(model.parameters()).device

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.static = StaticCache(config=model.config, max_cache_len=length)
            if len(self.static.layers) != len(own) // 2:
                raise UnsupportedConversionError(
                    f"the static cache has {len(self.static.layers)} layers, the decoder "
                    f"{len(own) // 2}"
                )
            self.static.early_initialization(batch, heads.pop(), sizes.pop(), dtype, device)
            self.layers: list[Any] = list(self.static.layers)
            for i, layer in enumerate(self.layers):
                self.register_buffer(f"key_cache_{i}", layer.keys, persistent=False)
                self.register_buffer(f"value_cache_{i}", layer.values, persistent=False)
                self.register_buffer(f"length_{i}", layer.cumulative_length, persistent=False)

        def forward(
            self,
            decoder_input_ids: Any,
            encoder_hidden_states: Any,
            encoder_attention_mask: Any = None,
            cache_position: Any = None,
        ) -> Any:
            # the positions written so far: the caller's, so that one program serves any
            # number of generations (the cache is never reset between them)
            for layer in self.layers:
                layer.cumulative_length.copy_(cache_position[0])
            cache = EncoderDecoderCache(self.static, DynamicCache())
            return decoder_logits(
                self.model, decoder_input_ids, encoder_hidden_states, encoder_attention_mask, cache
            ).logits

    return Decoder().eval()


def export_pt2(
    model: Any, folder: Path, batch: int, length: int, meta: dict[str, Any], mode: ExportMode
) -> None:
    """``encoder.pt2`` and ``decoder.pt2`` (static cache) into ``folder``, exported in ``mode``
    (``--export-mode``)."""
    import torch

    from ptconvert.generation.static_cache import save_program

    speech = is_speech(model)
    positions = 0 if speech else _encoder_positions(model, length)
    rows = torch.export.Dim("batch_size", min=1, max=1024)
    new = torch.export.Dim("decoder_sequence_length", min=1, max=length)
    example_new = min(3, length)
    inputs = encoder_example(model, batch, min(6, positions))
    # a speech encoder's frames are fixed: only the batch is dynamic
    source = None if speech else torch.export.Dim("encoder_sequence_length", min=1, max=positions)
    sources = {0: rows} if speech else {0: rows, 1: source}
    with torch.no_grad():
        encoder = _export_part(
            model, "encoder", encoder_module(model), inputs, dict.fromkeys(inputs, sources), mode
        )
        states = encoder.module()(**inputs)
        decoder_inputs = {
            "decoder_input_ids": torch.zeros((batch, example_new), dtype=torch.long),
            "encoder_hidden_states": states,
            "encoder_attention_mask": inputs.get("attention_mask"),
            "cache_position": torch.arange(example_new),
        }
        dims: dict[str, Any] = {
            "decoder_input_ids": {1: new},
            "encoder_hidden_states": None if speech else {1: source},
            "encoder_attention_mask": {1: source},
            "cache_position": {0: new},
        }
        if speech:  # Whisper's decoder takes no mask of the encoder's positions
            del decoder_inputs["encoder_attention_mask"], dims["encoder_attention_mask"]
        decoder = _export_part(
            model, "decoder", static_decoder(model, batch, length), decoder_inputs, dims, mode
        )
    save_program(encoder, folder / ENCODER_PT2, {**meta, "part": "encoder"})
    save_program(decoder, folder / DECODER_PT2, {**meta, "part": "decoder"})


def _export_part(
    model: Any, part: str, module: Any, inputs: dict[str, Any], dims: Any, mode: ExportMode
) -> Any:
    """The encoder or the decoder (``part``) exported in ``mode``; a failure said, never an
    internal error."""
    from ptconvert.convert.exporting import export_in_mode

    try:
        return export_in_mode(module, (), inputs, dims, mode)
    except Exception as exc:  # torch raises many kinds here: the first line says which
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise UnsupportedConversionError(
            f"{type(model).__name__}'s {part} does not export (pt2, static cache): "
            f"{type(exc).__name__}: {first}",
            hint="--to onnx writes optimum's folder of graphs with past_key_values inputs "
            "(no static cache)",
        ) from None


def encoder_inputs(model: Any) -> str:
    """The encoder's inputs as the report's interface writes them."""
    if is_speech(model):
        mels, frames = feature_shape(model)
        return f"input_features[batch, {mels}, {frames}]"
    return "input_ids, attention_mask"


def export_folder(
    model: Any, src: Path, tmp: Path, out: Path, opts: Any, notes: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``encoder.pt2`` and ``decoder.pt2`` (static cache) into the folder ``tmp``, with the
    model's configs; the report's cache and interface (``src`` and ``out``: an AOTI package's,
    ``targets.Target``)."""
    from ptconvert import progress
    from ptconvert.convert.exporting import wrapper_mode
    from ptconvert.generation.static_cache import cache_batch, cache_length, static_meta

    start = start_token(model)
    source = encoder_inputs(model)
    batch = cache_batch(opts.batch_sizes)
    length = cache_length(model, opts.cache_length)
    meta = static_meta(
        model, opts, batch, length, decoder_start_token_id=start, **encoder_meta(model)
    )
    with progress.step(
        f"exporting the encoder and the decoder with a static cache (batch {batch}, "
        f"{length} positions)"
    ):
        export_pt2(model, tmp, batch, length, meta, wrapper_mode(opts.strict))
    notes.append(
        f"decoder's static cache of {batch} row(s) × {length} positions inside "
        f"{DECODER_PT2} (mutated buffers; the cross-attention keys and values are "
        "computed from the encoder's states in every call); a smaller batch runs padded "
        "with copies of its last row (ptconvert.generate does it)"
    )
    cache = {"kind": "static", "batch_size": batch, "length": length}
    mask = "" if is_speech(model) else "encoder_attention_mask, "
    interface = {
        "call": f"{ENCODER_PT2}({source}) → last_hidden_state h "
        f"once; {DECODER_PT2}(decoder_input_ids=ids[batch, n], "
        f"encoder_hidden_states=h, {mask}cache_position=arange(pos, pos + "
        f"n)) → logits, from decoder_start_token_id {start}",
        "files": [ENCODER_PT2, DECODER_PT2, *CONFIGS],
        "decoder_start_token_id": start,
    }
    write_configs(model, tmp)
    return cache, interface


def read_folder(path: Path) -> dict[str, Any]:
    """What a pt2 folder says of itself: its decoder's ``generation.json`` (the task, the
    static cache), the text seq2seq task where it names none."""
    from ptconvert.generation.static_cache import read_meta
    from ptconvert.options import GENERATION_TASKS

    task = next(t for t, kind in GENERATION_TASKS.items() if kind == "seq2seq")
    return {"task": task, **(read_meta(path / DECODER_PT2) or {})}


def open_folder(path: Path, trust: bool) -> StaticSeq2Seq:
    """The stepper of a pt2 folder (``trust``: an AOTI package's, ``targets.Target``)."""
    return StaticSeq2Seq(path)


def _encoder_positions(model: Any, length: int) -> int:
    """The longest prompt the encoder program takes: the model's positions where it has a
    table of them, else the cache's length (T5's relative positions have no limit)."""
    positions = getattr(model.config, "max_position_embeddings", None)
    return int(positions) if positions else max(length, 64)


class StaticSeq2Seq:
    """A folder of ``encoder.pt2`` and ``decoder.pt2``: the encoder once on the prompt, then
    the decoder from the start token, one token a step, its static cache at the positions fed
    so far; a batch smaller than the cache's is padded with copies of its last row. A speech
    model's encoder takes ``input_features`` (3-D float; ``generation.json``'s
    ``feature_shape``) and its decoder no mask."""

    def __init__(self, folder: Path) -> None:
        from ptconvert.formats.pt2 import load_exported
        from ptconvert.generation.static_cache import read_meta
        from ptconvert.scan.guard import guard

        meta = read_meta(folder / DECODER_PT2) or {}
        if meta.get("cache") != "static":
            raise UsageError(f"{DECODER_PT2} has no static cache (generation.json)", path=folder)
        for name in (ENCODER_PT2, DECODER_PT2):
            guard(folder / name)  # every load of a pickle goes through the scanner first
        self.encoder = load_exported(folder / ENCODER_PT2).module()
        self.decoder = load_exported(folder / DECODER_PT2).module()
        self.batch = int(meta["batch_size"])
        self.length = int(meta["cache_length"])
        start = meta.get("decoder_start_token_id")
        self.start_id = int(start) if isinstance(start, int) else read_start_token(folder)
        shape = meta.get("feature_shape")
        self.features: tuple[int, ...] | None = tuple(shape) if shape else None
        self.input_rank = 3 if self.features else 2
        self.path = folder
        self.rows = self.position = 0
        self.states: Any = None
        self.mask: Any = None

    def prefix(self, input_ids: Any) -> Any:
        return start_ids(input_ids, self.start_id)

    def _padded(self, ids: Any) -> Any:
        import torch

        missing = self.batch - ids.shape[0]
        return torch.cat([ids, ids[-1:].expand(missing, *ids.shape[1:])]) if missing else ids

    def _decode(self, ids: Any) -> Any:
        import torch

        count = ids.shape[1]
        mask = {} if self.mask is None else {"encoder_attention_mask": self.mask}
        logits = self.decoder(
            decoder_input_ids=self._padded(ids),
            encoder_hidden_states=self.states,
            cache_position=torch.arange(self.position, self.position + count),
            **mask,
        )
        self.position += count
        return logits[: self.rows, -1]

    def start(self, input_ids: Any, max_new_tokens: int) -> Any:
        import torch

        rows = input_ids.shape[0]
        if rows > self.batch:
            raise UsageError(
                f"the decoder's static cache holds {self.batch} row(s), the prompt has {rows}",
                path=self.path,
                hint="export with --batch-sizes up to the batch you generate at",
            )
        if max_new_tokens > self.length:
            raise UsageError(
                f"{max_new_tokens} new tokens do not fit the decoder's static cache of "
                f"{self.length} positions",
                path=self.path,
                hint="export with a longer --cache-length",
            )
        if self.features is not None:
            check_features(input_ids, self.features, self.path)
            self.mask = None
            self.states = self.encoder(input_features=self._padded(input_ids.float()))
        else:
            ids = self._padded(input_ids.long())
            self.mask = torch.ones_like(ids)
            self.states = self.encoder(input_ids=ids, attention_mask=self.mask)
        self.rows, self.position = rows, 0
        return self._decode(self.prefix(input_ids))

    def step(self, tokens: Any) -> Any:
        return self._decode(tokens.long())
