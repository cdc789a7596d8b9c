"""Example inputs: from ``--input NAME:SHAPE:DTYPE`` specs, a file, a Hugging Face config, or
the model factory's own ``example_inputs``. Inputs are a function of the batch size, so that a
program can be checked at several sizes with the same recipe (seeded, reproducible).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ptconvert.errors import UsageError

_SPEC = re.compile(r"^(?P<name>[A-Za-z_]\w*):(?P<shape>\d+(?:x\d+)*):(?P<dtype>\w+)$")
INT_HIGH = 100  # token ids and other integer inputs are drawn from [0, INT_HIGH)


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    high: int = INT_HIGH  # exclusive upper bound for integer inputs

    @property
    def batched(self) -> bool:
        return len(self.shape) > 0


def parse_input(text: str) -> InputSpec:
    m = _SPEC.match(text)
    if m is None:
        raise UsageError(
            f"--input {text!r} is not NAME:SHAPE:DTYPE (e.g. x:2x3x224x224:float32, "
            "input_ids:2x16:int64)"
        )
    return InputSpec(m["name"], tuple(int(s) for s in m["shape"].split("x")), m["dtype"])


@dataclass
class ExampleInputs:
    """Named inputs, made for any batch size; ``batch`` is the size the recipe was given at."""

    make: Callable[[int], dict[str, Any]]
    batch: int
    source: str

    def at(self, batch: int) -> dict[str, Any]:
        return self.make(batch)


def from_specs(specs: list[InputSpec], seed: int = 0) -> ExampleInputs:
    import torch

    def make(batch: int) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(seed + batch)
        out: dict[str, Any] = {}
        for s in specs:
            shape = (batch, *s.shape[1:]) if s.batched else s.shape
            dtype = getattr(torch, s.dtype, None)
            if not isinstance(dtype, torch.dtype):
                raise UsageError(f"--input {s.name}: unknown dtype {s.dtype!r}")
            if dtype.is_floating_point or dtype.is_complex:
                out[s.name] = torch.randn(shape, generator=gen).to(dtype)
            elif dtype == torch.bool:
                out[s.name] = torch.randint(0, 2, shape, generator=gen).bool()
            else:
                out[s.name] = torch.randint(0, s.high, shape, generator=gen, dtype=dtype)
        return out

    batch = specs[0].shape[0] if specs and specs[0].batched else 1
    return ExampleInputs(make, batch, "--input")


def from_hf_config(config: Any, batch: int = 2, seq: int = 16) -> ExampleInputs:
    """Inputs a transformers model of this config takes: token ids inside the vocabulary with
    attention masks, pixel values at the configured image size, mel features for audio."""
    specs: list[InputSpec] = []
    vocab = int(getattr(config, "vocab_size", INT_HIGH) or INT_HIGH)
    if getattr(config, "num_mel_bins", None):  # speech encoder-decoders (Whisper)
        frames = 2 * int(getattr(config, "max_source_positions", 1500))
        specs.append(
            InputSpec("input_features", (batch, int(config.num_mel_bins), frames), "float32")
        )
        specs.append(InputSpec("decoder_input_ids", (batch, 4), "int64", vocab))
    elif getattr(config, "image_size", None) and getattr(config, "num_channels", None):
        size = int(config.image_size)
        specs.append(
            InputSpec("pixel_values", (batch, int(config.num_channels), size, size), "float32")
        )
    else:
        specs.append(InputSpec("input_ids", (batch, seq), "int64", vocab))
        specs.append(InputSpec("attention_mask", (batch, seq), "int64", 2))
        if getattr(config, "is_encoder_decoder", False):
            specs.append(InputSpec("decoder_input_ids", (batch, 4), "int64", vocab))
    inputs = from_specs(specs)
    masks = [s.name for s in specs if s.name == "attention_mask"]

    def make(b: int) -> dict[str, Any]:
        out = inputs.make(b)
        for name in masks:  # a real mask: ones, with padding at the end of one row
            out[name] = out[name].new_ones(out[name].shape)
            if b > 1:
                out[name][-1, -2:] = 0
        return out

    return ExampleInputs(make, batch, "Hugging Face config")


def from_file(path: Path) -> ExampleInputs:
    """Inputs saved in a safetensors file (or a weights-only torch file): used as they are."""
    from ptconvert.convert.weights_read import as_tensors, read_weights
    from ptconvert.scan.guard import guard

    guard(path)
    tensors = as_tensors(read_weights(path, keep_prefix=True))
    batch = next((t.shape[0] for t in tensors.values() if t.dim() > 0), 1)

    def make(b: int) -> dict[str, Any]:
        if b == batch:
            return dict(tensors)
        return {k: resize_batch(v, b) for k, v in tensors.items()}

    return ExampleInputs(make, batch, str(path))


def resize_batch(t: Any, batch: int) -> Any:
    """``t`` with ``batch`` rows: its rows repeated (or cut), for checks at other batch sizes."""
    import torch

    if t.dim() == 0:
        return t
    reps = -(-batch // t.shape[0])
    return torch.cat([t] * reps)[:batch]
