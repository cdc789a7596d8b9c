"""The ExecuTorch target's own options (``PteFormat.options_class``): ``--pte-backend``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from ptconvert.options import flag

PteBackend = Literal["xnnpack", "portable"]


@dataclass
class PteOptions:
    # the ops XNNPACK takes delegated to it, or every op on the portable kernels
    pte_backend: PteBackend = field(
        default="xnnpack",
        metadata=flag(
            "--pte-backend",
            choices=get_args(PteBackend),
            help="--to pte: delegate what XNNPACK takes to it (default), or run every op on "
            "ExecuTorch's portable kernels.",
        ),
    )
