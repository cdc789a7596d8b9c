"""AOTInductor's package loader, as the AOTI target's program runs in its own process
(``isolated.Load``)."""

from __future__ import annotations

from typing import Any

from ptconvert import _compat


def load(path: str, device: str) -> tuple[Any, list[str] | None, list[str]]:
    import torch

    runner, in_spec = _compat.inductor.load_package(path)
    pytree = _compat.torch_api.pytree()
    kwargs_spec = in_spec.children()[1] if in_spec.num_children == 2 else None
    keywords = list(getattr(kwargs_spec, "context", None) or [])

    def run(feeds: dict[str, Any]) -> list[Any]:
        tensors = {k: torch.as_tensor(v).to(device) for k, v in feeds.items()}
        if keywords:  # exported by keyword: the package binds the names itself
            out = runner(**{k: v for k, v in tensors.items() if k in keywords})
        else:
            out = runner(*tensors.values())
        return [o.detach().cpu() for o in pytree.tree_leaves(out)]  # the pipe's arrays: isolated

    return run, keywords or None, [device]
