"""The axes a transformers model family varies besides the batch, named as optimum names them.

``--dynamic-batch`` on a Hugging Face model makes these dynamic too (``--static-sequence``
keeps them at the example's size):

- ``sequence_length``: dim 1 of the text inputs (input_ids, attention_mask, token_type_ids,
  position_ids: one length), 1 to the config's ``max_position_embeddings``; for a raw
  waveform (Wav2Vec2's ``input_values``) dim 1, from the shortest the conv feature extractor
  turns into one frame;
- ``decoder_sequence_length``: dim 1 of ``decoder_input_ids``/``decoder_attention_mask``, 1 to
  the decoder's ``max_target_positions`` (or its position table);
- ``height``/``width``: dims 2 and 3 of ``pixel_values``; a model that only takes its
  configured size (ViT's position table) fixes them when exported, and the export falls back
  to the example's size, saying so.

Whisper's mel frames stay the example's (the encoder raises at any other count).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ptconvert.model.hf_inputs import (
    _AUDIO,
    _DECODER,
    _DECODER_LENGTHS,
    _TEXT,
    _TEXT_LENGTHS,
    _VISION,
    _find,
    _first,
)

# the text inputs whose dim 1 is the sequence (optimum's ``sequence_length``)
SEQUENCE_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
DECODER_INPUTS = ("decoder_input_ids", "decoder_attention_mask")
# (input, dim) → optimum's name for it, wherever a program of a transformers model comes from
AXIS_NAMES = {
    **{(n, 1): "sequence_length" for n in SEQUENCE_INPUTS},
    **{(n, 1): "decoder_sequence_length" for n in DECODER_INPUTS},
    ("input_values", 1): "sequence_length",
    ("pixel_values", 2): "height",
    ("pixel_values", 3): "width",
}


@dataclass(frozen=True)
class Axis:
    """One dynamic axis shared by some inputs: ``dims`` are (input, dim); sizes low–high."""

    name: str  # AXIS_NAMES
    dims: tuple[tuple[str, int], ...]
    low: int
    high: int | None

    def words(self, held: str | None = None) -> str:
        """In words; ``held``: the program's own range for it (torch may narrow the asked one)."""
        top = held or (f"{self.low}–{self.high}" if self.high else f"{self.low} or more")
        inputs = ", ".join(n for n, _ in self.dims)
        return f"dim {self.dims[0][1]} of {inputs} ({self.name}: {top})"


def _limit(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def longest_sequence(config: Any) -> int | None:
    """The longest token sequence a text model's config allows (``max_position_embeddings``,
    GPT-2's ``n_positions``, …, in its text sub-config first); None when it sets none (relative
    positions: T5)."""
    return _limit(_first(config, _TEXT_LENGTHS, _TEXT))


def _position_offset(model: Any) -> int:
    """Positions a text model's table reserves before the first token: RoBERTa and its kin
    number tokens from ``padding_idx + 1`` (a table of 514 holds 512 tokens), which their
    position embedding says by its ``padding_idx``."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] != "position_embeddings":
            continue
        padding = getattr(module, "padding_idx", None)
        if isinstance(padding, int) and getattr(module, "num_embeddings", 0) > padding >= 0:
            return padding + 1
    return 0


def _dims(value: Any) -> int:
    dim = getattr(value, "dim", None)
    return int(dim()) if callable(dim) else 0


def _int_2d(value: Any) -> bool:
    return _dims(value) == 2 and not value.dtype.is_floating_point


def _shared(sample: dict[str, Any], names: tuple[str, ...], lead: str) -> tuple[str, ...]:
    """Those of ``names`` that ``sample`` has as 2-D integer tensors as long as ``lead``."""
    length = sample[lead].shape[1]
    return tuple(n for n in names if _int_2d(sample.get(n)) and sample[n].shape[1] == length)


def _shortest_waveform(config: Any) -> int:
    """The fewest samples a conv feature extractor turns into one frame."""
    kernels = _find(config, "conv_kernel", _AUDIO) or ()
    strides = _find(config, "conv_stride", _AUDIO) or ()
    length = 1
    for k, s in reversed(list(zip(kernels, strides, strict=False))):
        length = (length - 1) * int(s) + int(k)
    return length


def model_axes(model: Any, sample: dict[str, Any]) -> list[Axis]:
    """The axes ``model`` (a transformers model) varies in ``sample``, in the order they are
    given up when an export fixes one: text sequence, decoder sequence, waveform, image."""
    config = getattr(model, "config", None)
    if config is None:
        return []
    axes: list[Axis] = []
    if _int_2d(sample.get("input_ids")):
        names = _shared(sample, SEQUENCE_INPUTS, "input_ids")
        longest = longest_sequence(config)
        if longest:
            longest -= _position_offset(model)
        axes.append(Axis("sequence_length", tuple((n, 1) for n in names), 1, longest))
    if _int_2d(sample.get("decoder_input_ids")):
        names = _shared(sample, DECODER_INPUTS, "decoder_input_ids")
        longest = _limit(_first(config, _DECODER_LENGTHS, _DECODER))
        axes.append(Axis("decoder_sequence_length", tuple((n, 1) for n in names), 1, longest))
    wave: Any = sample.get("input_values")
    if _dims(wave) == 2 and wave.dtype.is_floating_point and _find(config, "conv_kernel", _AUDIO):
        axes.append(
            Axis("sequence_length", (("input_values", 1),), _shortest_waveform(config), None)
        )
    pixels: Any = sample.get("pixel_values")
    if _dims(pixels) == 4 and pixels.dtype.is_floating_point:
        axes.append(Axis("height", (("pixel_values", 2),), 1, None))
        axes.append(Axis("width", (("pixel_values", 3),), 1, None))
    return axes


def planned_axes(config: Any) -> dict[str, str]:
    """What ``model_axes`` will make dynamic, in words, from a config alone (before the model
    is built, which decides the inputs): ``plan``'s view."""
    keep = "; --static-sequence keeps the example's sizes"
    longest = longest_sequence(config)
    top = f"1–{longest} (the config's limit)" if longest else "1 or more"
    out = {
        "sequence_length": f"dim 1 of {', '.join(SEQUENCE_INPUTS)} (those the model takes, when "
        f"it takes input_ids), {top}{keep}"
    }
    if getattr(config, "is_encoder_decoder", False):
        longest = _limit(_first(config, _DECODER_LENGTHS, _DECODER))
        top = f"1–{longest} (the config's limit)" if longest else "1 or more"
        out["decoder_sequence_length"] = f"dim 1 of {', '.join(DECODER_INPUTS)}, {top}{keep}"
    if _find(config, "conv_kernel", _AUDIO):
        out["sequence_length"] = (
            f"dim 1 of input_values (a waveform), {_shortest_waveform(config)} samples or "
            f"more{keep}"
        )
    if _find(config, "image_size", _VISION) is not None or _find(config, "num_channels", _VISION):
        out["height, width"] = (
            "dims 2 and 3 of pixel_values where the model takes other sizes (else the "
            f"example's: a position table fixes them){keep}"
        )
    return out
