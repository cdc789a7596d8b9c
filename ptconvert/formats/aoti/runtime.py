"""AOTInductor's package loader, as the AOTI target's program runs in its own process
(``isolated.Load``)."""

from __future__ import annotations

from typing import Any

from ptconvert import _compat

# the package's metadata entry (Inductor's ``aot_inductor.metadata``, read back by the runner's
# ``get_metadata``) naming forward's positional inputs, comma-separated: the call spec of a
# package exported positionally has their count, not their names, and inputs fed in the
# example's order reached the wrong parameters (a safetensors file lists ``x`` before ``pred``:
# "input_handles[0]: unmatched dtype, expected kBool")
INPUT_NAMES = "ptconvert.input_names"


def load(path: str, device: str) -> tuple[Any, list[str] | None, list[str]]:
    import torch

    runner, in_spec = _compat.inductor.load_package(path)
    pytree = _compat.torch_api.pytree()
    kwargs_spec = in_spec.children()[1] if in_spec.num_children == 2 else None
    keywords = list(getattr(kwargs_spec, "context", None) or [])
    positional = _positional_names(runner, in_spec) if not keywords else []

    def run(feeds: dict[str, Any]) -> list[Any]:
        tensors = {k: torch.as_tensor(v).to(device) for k, v in feeds.items()}
        if keywords:  # exported by keyword: the package binds the names itself
            out = runner(**{k: v for k, v in tensors.items() if k in keywords})
        elif positional and set(positional) <= set(tensors):  # in forward's order, by name
            out = runner(*(tensors[n] for n in positional))
        else:  # names not known: in the order given
            out = runner(*tensors.values())
        return [o.detach().cpu() for o in pytree.tree_leaves(out)]  # the pipe's arrays: isolated

    return run, keywords or positional or None, [device]


def _positional_names(runner: Any, in_spec: Any) -> list[str]:
    """Forward's positional inputs as the package's metadata names them (ptconvert writes
    them); [] when it does not, or names another number of them than the call spec holds."""
    get = getattr(runner, "get_metadata", None)
    text = (get() if callable(get) else {}).get(INPUT_NAMES, "")
    names = [n for n in text.split(",") if n]
    args = in_spec.children()[0] if in_spec.num_children else None
    return names if args is not None and len(names) == args.num_children else []
