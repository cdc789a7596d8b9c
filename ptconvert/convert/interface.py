"""The calling convention of a written program, as a user calls it: the report's
``interface`` (how it loads, how it is called, which inputs by which names, what sizes it
accepts)."""

from __future__ import annotations

from typing import Any

from ptconvert.convert.program_check import dynamism
from ptconvert.convert.renamed_inputs import program_names, renamed_where
from ptconvert.convert.state import RunState
from ptconvert.formats import FORMATS_BY_NAME
from ptconvert.options import Options
from ptconvert.verify.parity import ParityReport


def interface(
    state: RunState, to: str, opts: Options, parity: ParityReport | None, *, folder: bool = False
) -> dict[str, Any]:
    """The calling convention of the written program, as a user calls it (``folder``: written
    in the folder its client loads, ``Format.folder_load_line``)."""
    target = FORMATS_BY_NAME.get(to)
    if target is None or target.kind != "program" or state.inputs is None:
        return {}
    from ptconvert.model.wrappers import leaf_name

    sample = given = state.inputs.at(state.inputs.batch)
    names = state.positional or list(sample)
    if target.takes_leaves:  # the inputs the program takes: a nested one's leaves, named
        from ptconvert.formats.isolated import flat_inputs

        names = list(flat_inputs({n: sample.get(n) for n in names}))
        sample = flat_inputs(sample)
    graph_outputs: list[str] | None = None
    ranges = state.dynamic_range
    if state.graph_names is not None:  # the file names what it takes and returns
        taken, graph_outputs = state.graph_names
        # a TS2EP program's graph keeps the converter's names (x_1) where it dropped a scalar
        as_graph = {e: p for p, e in (program_names(state) or {}).items() if p in taken}
        names = [as_graph.get(n, n) for n in names]
        sample = {as_graph.get(n, n): v for n, v in sample.items()}
        ranges = {renamed_where(w, as_graph): t for w, t in ranges.items()}
        left_out = {n for n in names if n not in taken}  # a trace drops what it does not read
        ranges = {w: t for w, t in ranges.items() if w.rpartition(" dim ")[0] not in left_out}
        names = [n for n in names if n in taken] + [n for n in taken if n not in names]
        sample = {n: v for n, v in sample.items() if n in taken}
    # a program captured by torch.export binds by keyword or by position, as it was captured;
    # TorchScript binds either way; ONNX from TorchScript's exporter (declared dims) by name
    exported = state.exported is not None or state.declared is not None
    keyword = state.positional is None and exported
    args = ", ".join(f"{n}=…" if keyword else n for n in names)
    if not exported:
        args += ", positionally or by keyword"
    sizes = parity.sizes if parity else []
    outputs = [leaf_name(o.name) for o in sizes[0].outputs] if sizes else []
    if outputs and all(o.startswith("call ") for o in outputs):  # a stateful model's calls
        outputs = [o.partition(".")[2] or "output" for o in outputs if o.startswith("call 1")]
    if graph_outputs is not None:
        outputs = graph_outputs
    accepts: list[str] = []
    # Python numbers; a list or dict of tensors is an input like a tensor
    # (from the inputs given: an ONNX graph has no input for them)
    fixed = [n for n, v in given.items() if isinstance(v, (bool, int, float, complex))]
    if fixed and exported:
        accepts.append(
            "the scalar inputs are fixed at their example values ("
            + ", ".join(f"{n}={given[n]!r}" for n in fixed)
            + "): torch.export specialises Python numbers; TorchScript takes any"
        )
    if exported and not dynamism(state)[0]:
        shapes = {n: list(v.shape) for n, v in sample.items() if hasattr(v, "shape")}
        why = "static: pass --dynamic-batch or --dynamic for other sizes"
        if opts.dynamic_batch or opts.dynamic:
            why = "static, though dynamic dims were asked: the route that matched eager has none"
        accepts.append(
            "only the example's shapes "
            + ", ".join(f"{n}{s}" for n, s in shapes.items())
            + f" ({why})"
        )
    if exported:
        accepts += _grouped(ranges)
    return {
        "load": (target.folder_load_line if folder else target.load_line).replace("\n", "; "),
        "call": target.call_line(args),
        "inputs": names,
        "example": {n: list(v.shape) for n, v in sample.items() if hasattr(v, "shape")},
        "keyword": keyword,
        "outputs": outputs,
        "accepts": accepts,
    }


def _grouped(dynamic_range: dict[str, str]) -> list[str]:
    """``input_ids dim 0: batch 1 or more`` and the same for ``attention_mask``: one line
    naming both (a BERT's three inputs said the same three times)."""
    same: dict[tuple[str, str], list[str]] = {}
    for where, words in dynamic_range.items():
        name, _, dim = where.rpartition(" dim ")
        key = (f"dim {dim}", words) if name else (where, words)
        same.setdefault(key, []).append(name or "")
    return [
        f"{', '.join(n for n in names if n)} {where}: {words}".lstrip()
        for (where, words), names in same.items()
    ]
