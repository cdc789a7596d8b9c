"""ExecuTorch's runtime, as the pte target's program runs in its own process (``isolated.Load``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load(path: str, device: str) -> tuple[Any, list[str] | None, list[str]]:
    """ExecuTorch's runtime: ``forward`` takes its inputs as one flat list, in the order of the
    exporter's pytree spec (by keyword: the spec's names; positionally: as given)."""
    import torch
    from executorch.runtime import Runtime

    from ptconvert.formats.pte.flatbuffer import forward_of, read_program

    names = forward_of(read_program(Path(path))).input_names
    method = Runtime.get().load_program(path).load_method("forward")
    if method is None:
        raise RuntimeError("the program has no forward method")

    def run(feeds: dict[str, Any]) -> list[Any]:
        order = [feeds[n] for n in names if n in feeds] if names else list(feeds.values())
        out = method.execute([torch.as_tensor(v) for v in order])
        return list(out)  # tensors, made the pipe's arrays by isolated

    return run, names, ["cpu"]
