"""The GGUF target's own options (``GgufFormat.options_class``): the CLI's ``--gguf-type``, the
API's keyword ``gguf_type``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ptconvert.options import flag

GgufType = Literal["f32", "f16", "bf16", "q8_0"]
GGUF_TYPES: tuple[str, ...] = ("f32", "f16", "bf16", "q8_0")
# --dtype's name of each plain type: the two options must agree where both are given
DTYPE_OF = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


@dataclass
class GgufOptions:
    # the type of the written matrices (None: --dtype's, else the source's own precision)
    gguf_type: GgufType | None = field(
        default=None,
        metadata=flag(
            "--gguf-type",
            choices=GGUF_TYPES,
            help=(
                "--to gguf: the tensors' type: f32, f16, bf16, or q8_0 (llama.cpp's 8-bit "
                "blocks; norms stay f32). Default: --dtype's, else the source's."
            ),
        ),
    )
