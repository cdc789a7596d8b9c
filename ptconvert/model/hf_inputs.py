"""Example inputs for a transformers model, derived from what the model says of itself: its
forward's signature and ``main_input_name``, its config (and sub-configs) and the folder's
preprocessor_config.json. Token ids inside the vocabulary with a padded attention mask, decoder
ids, pixel values at the configured image size (a point prompt for SAM), mel features or a
waveform; an input the config does not describe is named with the ``--input`` line that would.

The sub-configs searched per modality, and the lookups through them, serve ``axes.py`` too (the
axes a family varies besides the batch).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ptconvert.errors import MissingRequirementError
from ptconvert.model.inputs import ExampleInputs, InputSpec, from_specs

# the sub-configs searched (in this order, depth first, before the config itself) for what a
# modality's inputs need
_TEXT = ("text_config", "text_encoder", "language_config", "llm_config", "encoder")
_DECODER = ("decoder", "text_decoder", "text_config", "language_config", "llm_config")
_VISION = (
    "vision_config",
    "backbone_config",
    "encoder",
    "vision_encoder",
    "image_config",
    "prompt_encoder_config",
)
_AUDIO = ("audio_config", "speech_config", "encoder", "audio_encoder")
_TEXT_LENGTHS = ("max_position_embeddings", "n_positions", "max_source_positions")
_DECODER_LENGTHS = ("max_target_positions", "max_position_embeddings", "n_positions")
_SEQ = 16  # text length
_DECODER_SEQ = 4
_FRAMES = 8  # frames a raw waveform yields after a conv feature extractor
_PAD = 2  # padded positions at the end of the last row's attention mask


def _is_config(obj: Any) -> bool:
    return hasattr(obj, "model_type") and hasattr(obj, "to_dict")


def _find(config: Any, attr: str, subs: tuple[str, ...], depth: int = 0) -> Any:
    """``attr`` of the first of ``subs`` (recursively) that sets it, else of ``config``."""
    if depth < 4:
        for name in subs:
            sub = getattr(config, name, None)
            if _is_config(sub) and sub is not config:
                found = _find(sub, attr, subs, depth + 1)
                if found is not None:
                    return found
    return getattr(config, attr, None)


def _first(config: Any, attrs: tuple[str, ...], subs: tuple[str, ...]) -> Any:
    return next((v for a in attrs if (v := _find(config, a, subs)) is not None), None)


def _size(value: Any) -> tuple[int, int] | None:
    """An image size from a config (int, [h, w]) or a preprocessor (dict of height/width, …)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return int(value), int(value)
    if isinstance(value, list | tuple) and len(value) == 2:
        return int(value[0]), int(value[1])
    if isinstance(value, dict):
        if "height" in value and "width" in value:
            return int(value["height"]), int(value["width"])
        edge = value.get("shortest_edge") or value.get("longest_edge")
        return (int(edge), int(edge)) if edge else None
    return None


def _preprocessor(directory: Path | None) -> dict[str, Any]:
    path = directory / "preprocessor_config.json" if directory is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # a broken preprocessor config only loses its hints
        return {}
    return data if isinstance(data, dict) else {}


class _Underivable(Exception):
    """An input the config does not describe; ``line`` is the ``--input`` that would."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


class _HfInputs:
    """The specs of a transformers model's inputs, from its config and preprocessor config."""

    def __init__(self, model: Any, pre: dict[str, Any], batch: int) -> None:
        self.config, self.pre, self.batch = model.config, pre, batch
        dtype = getattr(model, "dtype", None)
        # float inputs in the model's own dtype (a bf16 checkpoint loads as bf16)
        self.float = str(dtype).removeprefix("torch.") if dtype is not None else "float32"

    def ids(
        self, name: str, subs: tuple[str, ...], seq: int, lengths: tuple[str, ...]
    ) -> InputSpec:
        vocab = _find(self.config, "vocab_size", subs)
        longest = _first(self.config, lengths, subs)
        if isinstance(longest, int) and longest > 1:
            seq = min(seq, longest)
        if not isinstance(vocab, int) or vocab < 1:
            raise _Underivable(f"{name}:{self.batch}x{seq}:int64:0:VOCAB")
        return InputSpec(name, (self.batch, seq), "int64", low=0, high=vocab)

    def image_size(self) -> tuple[int, int] | None:
        size = _size(_find(self.config, "image_size", _VISION))
        if size is None and self.pre.get("do_center_crop", True):
            size = _size(self.pre.get("crop_size"))
        return size or _size(self.pre.get("size"))

    def pixel_values(self) -> InputSpec:
        channels = _find(self.config, "num_channels", _VISION) or 3
        size = self.image_size()
        if size is None:
            raise _Underivable(f"pixel_values:{self.batch}x{channels}xHxW:{self.float}")
        return InputSpec("pixel_values", (self.batch, int(channels), *size), self.float)

    def input_features(self) -> InputSpec:
        mels = _find(self.config, "num_mel_bins", _AUDIO) or self.pre.get("feature_size")
        mels = mels or self.pre.get("num_mel_bins")
        sources = _find(self.config, "max_source_positions", _AUDIO)
        per_channel = _find(self.config, "input_feat_per_channel", _AUDIO)
        if mels and sources:  # Whisper: exactly 2 × max_source_positions frames (conv stride 2)
            shape: tuple[int, ...] = (self.batch, int(mels), 2 * int(sources))
        elif per_channel:  # Speech2Text: frames × (features per channel × channels)
            channels = _find(self.config, "input_channels", _AUDIO) or 1
            shape = (self.batch, 4 * _SEQ, int(per_channel) * int(channels))
        else:
            raise _Underivable(f"input_features:{self.batch}x{mels or 'MELS'}xFRAMES:{self.float}")
        return InputSpec("input_features", shape, self.float)

    def input_values(self) -> InputSpec:
        kernels = _find(self.config, "conv_kernel", _AUDIO)
        strides = _find(self.config, "conv_stride", _AUDIO)
        mels = _find(self.config, "num_mel_bins", _AUDIO)
        frames = _find(self.config, "max_length", _AUDIO)
        rate = self.pre.get("sampling_rate") or _find(self.config, "sampling_rate", _AUDIO)
        if kernels and strides and len(kernels) == len(strides):
            # a raw waveform just long enough for the conv feature extractor to give _FRAMES
            length = _FRAMES
            for k, s in reversed(list(zip(kernels, strides, strict=True))):
                length = (length - 1) * int(s) + int(k)
            shape: tuple[int, ...] = (self.batch, length)
        elif mels and frames:  # a spectrogram (Audio Spectrogram Transformer): frames × mels
            shape = (self.batch, int(frames), int(mels))
        elif rate:  # a raw waveform of one second
            shape = (self.batch, int(rate))
        else:
            raise _Underivable(f"input_values:{self.batch}xSAMPLES:{self.float}")
        return InputSpec("input_values", shape, self.float)

    def point_prompt(self) -> list[InputSpec]:
        """One foreground point per image (SAM): pixel coordinates inside the input image."""
        prompt = getattr(self.config, "prompt_encoder_config", None)
        size = _size(getattr(prompt, "image_size", None))
        size = size or self.image_size()
        if size is None:
            raise _Underivable(f"input_points:{self.batch}x1x1x2:{self.float}:0:SIZE")
        return [
            InputSpec("input_points", (self.batch, 1, 1, 2), self.float, low=0, high=min(size)),
            InputSpec("input_labels", (self.batch, 1, 1), "int64", value=1),
        ]


def _forward_parameters(model: Any) -> dict[str, inspect.Parameter]:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    named = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return {n: p for n, p in params.items() if p.kind not in named and n != "self"}


def _has_image_token(config: Any) -> bool:
    """Vision-language models whose text must hold image tokens: run text-only by default."""
    attrs = ("image_token_id", "image_token_index")
    return _first(config, attrs, _TEXT + _VISION) is not None


def from_hf_model(
    model: Any, directory: Path | None = None, *, batch: int = 2, seed: int = 0
) -> ExampleInputs:
    """The inputs a transformers model is normally called with, from its forward's signature,
    ``main_input_name``, config (and sub-configs) and ``directory``'s preprocessor_config.json:
    token ids inside the vocabulary with an attention mask (and segment ids where the model has
    more than one token type), decoder ids for encoder-decoders,
    pixel values at the configured image size (with a point prompt for SAM), mel features or a
    waveform for speech. Raises MissingRequirementError for a required input it cannot derive.
    """
    params = _forward_parameters(model)
    main = getattr(model, "main_input_name", None)
    required = [n for n, p in params.items() if p.default is inspect.Parameter.empty]
    if main in params and main not in required:
        required.insert(0, main)
    config = model.config
    hf = _HfInputs(model, _preprocessor(directory), batch)
    has_prompt = _is_config(getattr(config, "prompt_encoder_config", None))
    makers: dict[str, Callable[[], list[InputSpec]]] = {
        "input_ids": lambda: [hf.ids("input_ids", _TEXT, _SEQ, _TEXT_LENGTHS)],
        "decoder_input_ids": lambda: [
            hf.ids("decoder_input_ids", _DECODER, _DECODER_SEQ, _DECODER_LENGTHS)
        ],
        "pixel_values": lambda: [hf.pixel_values()],
        "input_features": lambda: [hf.input_features()],
        "input_values": lambda: [hf.input_values()],
        "input_points": hf.point_prompt,
        "input_labels": hf.point_prompt,
    }
    # beyond the required ones: the inputs a model of its kind is normally called with
    usual = {"input_ids", "decoder_input_ids"}
    if not _has_image_token(config):
        usual.add("pixel_values")
    specs: dict[str, InputSpec] = {}
    for name in params:
        wanted = name in required or name in usual
        if name in ("input_points", "input_labels"):
            wanted = wanted or (has_prompt and "pixel_values" in params)
        if not wanted or name in specs:
            continue
        maker = makers.get(name)
        try:
            if maker is None:
                raise _Underivable(f"{name}:SHAPE:DTYPE")
            made = maker()
        except _Underivable as exc:
            if name not in required:  # an optional extra the config does not describe
                continue
            raise MissingRequirementError(
                f"cannot derive the input {name!r} of {type(model).__name__}.forward from its "
                "config" + (" or preprocessor_config.json" if directory is not None else ""),
                path=directory,
                hint=f"pass --input {exc.line}",
            ) from None
        specs.update({s.name: s for s in made if s.name in params})
    # the mask of the token ids (made to pad the last row below); no mask for other inputs
    # (Whisper's and Wav2Vec2's masks are for features the examples never pad)
    if "attention_mask" in params and "input_ids" in specs and "attention_mask" not in specs:
        specs["attention_mask"] = InputSpec(
            "attention_mask", specs["input_ids"].shape, "int64", value=1
        )
    # the segment ids of a model with more than one token type (BERT's sentence pairs), as
    # optimum exports them: an input the artifact takes, fed values other than its default 0
    types = _find(config, "type_vocab_size", _TEXT)
    segments = "token_type_ids" in params and "token_type_ids" not in specs
    if segments and "input_ids" in specs and isinstance(types, int) and types > 1:
        shape = specs["input_ids"].shape
        specs["token_type_ids"] = InputSpec("token_type_ids", shape, "int64", low=0, high=types)
    inputs = from_specs(list(specs.values()), seed=seed)
    masked = "attention_mask" in specs

    def make(b: int) -> dict[str, Any]:
        out = inputs.make(b)
        if masked and b > 1:  # a real mask: padding at the end of the last row (never all of it)
            mask = out["attention_mask"]
            pad = min(_PAD, mask.shape[1] - 1)
            if pad > 0:
                mask[-1, -pad:] = 0
        return out

    return ExampleInputs(make, batch, f"{type(model).__name__}.forward and its config")
