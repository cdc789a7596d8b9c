"""optimum's merged seq2seq decoder, ``decoder_model_merged.onnx``, built from the two split
ones as optimum's ``merge_decoders`` builds it (optimum/onnx/graph_transformations.py, called
with ``strict=False`` by its seq2seq export's post-processing), which its
``ORTModelForSeq2SeqLM`` loads before the split files:

- one ``If`` node on the input ``use_cache_branch`` (bool, shape [1]): its ``then`` branch the
  with-past decoder, its ``else`` branch the first-step one;
- the inputs: the first-step decoder's, then the with-past decoder's others
  (``past_key_values.N.…``), then ``use_cache_branch``; on the first step optimum feeds every
  past as zeros of 0 positions, so their position dims are named here (Whisper's encoder keys
  have fixed positions in the split decoder), ``encoder_sequence_length_out`` as optimum's;
- the outputs: the first-step decoder's (``logits``, ``present.N.decoder|encoder.…``); the
  with-past branch gives the encoder's keys and values as empty constants (they do not change:
  a client keeps the first step's), as optimum's ``_unify_onnx_outputs`` adds them;
- the weights: every initializer of the two (but scalars and 1-D int ones, which stay in their
  branch, as optimum keeps them) stored once in the outer graph, identical data under one name:
  the file is about the size of the larger decoder, not of both.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ptconvert.errors import UnsupportedConversionError, VerificationError

USE_CACHE = "use_cache_branch"
ENCODER_POSITIONS = "encoder_sequence_length_out"  # optimum's name for the cross pasts' dim
PAST_POSITIONS = "past_decoder_sequence_length"


def merge_decoders(first: Path, later: Path, out: Path) -> dict[str, int]:
    """``first`` (decoder_model.onnx) and ``later`` (decoder_with_past_model.onnx) as one graph
    written to ``out`` and run through ``onnx.checker``; the weights' counts and bytes
    (``shared``: stored once for both)."""
    import onnx

    a, b = onnx.load(str(first)), onnx.load(str(later))
    if _opset(a) != _opset(b):
        raise UnsupportedConversionError(
            f"the decoders' opsets differ ({_opset(a)}, {_opset(b)}): not merged", path=out
        )
    _pad_outputs(a.graph, b.graph)
    outer, counts = _share_initializers([a.graph, b.graph])
    branches = [
        onnx.helper.make_graph(
            list(g.graph.node),
            name,
            [],
            list(g.graph.output),
            [i for i in g.graph.initializer if _stays(i)],
        )
        for g, name in ((a, "no_past"), (b, "with_past"))
    ]
    use_cache = onnx.helper.make_tensor_value_info(USE_CACHE, onnx.TensorProto.BOOL, [1])
    outputs = _outputs(a.graph, b.graph)
    node = onnx.helper.make_node(
        "If",
        [USE_CACHE],
        [o.name for o in outputs],
        name="optimum::if",
        then_branch=branches[1],
        else_branch=branches[0],
    )
    graph = onnx.helper.make_graph(
        [node], "merged", [*_inputs(a.graph, b.graph), use_cache], outputs, outer
    )
    domains: dict[str, Any] = {}
    for entry in [*a.opset_import, *b.opset_import]:
        domains.setdefault(entry.domain, entry)
    model = onnx.helper.make_model(graph, opset_imports=list(domains.values()))
    model.ir_version = a.ir_version
    model.producer_name, model.producer_version = a.producer_name, a.producer_version
    if model.ByteSize() >= onnx.checker.MAXIMUM_PROTOBUF:
        raise UnsupportedConversionError(
            f"{out.name} would be over 2 GB in one file (ONNX external data is not there yet "
            "for generation exports)",
            path=out,
        )
    onnx.save(model, str(out))
    try:
        onnx.checker.check_model(str(out), full_check=True)
    except Exception as exc:
        raise UnsupportedConversionError(
            f"{out.name} fails onnx.checker: {str(exc)[:300]}", path=out
        ) from None
    return counts


def compare_branch(
    merged: dict[str, Any], split: dict[str, Any], use_cache: bool, path: Path
) -> float:
    """One step's outputs of the merged decoder against the split decoder's on the same inputs
    (by name: the with-past branch's empty encoder presents are not the split one's), within
    the parity tolerance of their dtype (onnxruntime optimizes a branch on its own: the last
    bits may differ): the largest difference; a ``VerificationError`` where they differ."""
    import numpy as np

    from ptconvert.verify.parity import TOLERANCES

    branch = "use_cache_branch true" if use_cache else "use_cache_branch false"
    worst = 0.0
    for name, want in split.items():
        got = merged[name]
        tolerance = TOLERANCES.get(str(want.dtype), TOLERANCES["float32"])
        if got.shape != want.shape or not np.allclose(got, want, tolerance, tolerance):
            error = float(np.abs(got - want).max()) if got.shape == want.shape else None
            differ = f"by up to {error:.3g}" if error is not None else (
                f"in shape, {got.shape} against {want.shape}")  # fmt: skip
            raise VerificationError(
                f"decoder_model_merged.onnx ({branch}) differs from the split decoder's "
                f"{name} {differ}",
                path=path,
            )
        worst = max(worst, float(np.abs(got - want).max(initial=0.0)))
    return worst


def _opset(model: Any) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _stays(initializer: Any) -> bool:
    """Kept in its branch, as optimum keeps it: a scalar, or a 1-D int32/int64 tensor."""
    dims = len(initializer.dims)
    return dims == 0 or (dims == 1 and initializer.data_type in (6, 7))


def _pad_outputs(first: Any, later: Any) -> None:
    """``later``'s outputs in ``first``'s order, an empty constant for each one it lacks (the
    encoder's keys and values): its first dynamic dim 0, the others 1 (optimum's)."""
    import onnx

    have = {o.name: o for o in later.output}
    extra = set(have) - {o.name for o in first.output}
    if extra:
        raise UnsupportedConversionError(
            f"the with-past decoder has outputs the first-step one lacks: {sorted(extra)}"
        )
    del later.output[:]
    for output in first.output:
        if output.name in have:
            later.output.append(have[output.name])
            continue
        dims, dynamic = [], False
        for d in output.type.tensor_type.shape.dim:
            dims.append(d.dim_value if d.HasField("dim_value") else (1 if dynamic else 0))
            dynamic = dynamic or not d.HasField("dim_value")
        elem = output.type.tensor_type.elem_type
        empty = onnx.helper.make_tensor("const_tensor", elem, dims, [])
        later.node.append(
            onnx.helper.make_node(
                "Constant", [], [output.name], name=f"Constant_{output.name}", value=empty
            )
        )
        later.output.append(output)


def _inputs(first: Any, later: Any) -> list[Any]:
    """The first decoder's inputs, then the later one's others, the pasts' positions named."""
    seen: dict[str, Any] = {}
    for value in [*first.input, *later.input]:
        seen.setdefault(value.name, value)
    for name, value in seen.items():
        if name.startswith("past_key_values."):
            dims = value.type.tensor_type.shape.dim
            dims[2].Clear()
            dims[2].dim_param = ENCODER_POSITIONS if ".encoder." in name else PAST_POSITIONS
    return list(seen.values())


def _outputs(first: Any, later: Any) -> list[Any]:
    """The first decoder's outputs, its presents' positions as the later one's say them (past
    and new: the first step's past has 0 positions)."""
    import onnx

    later_by_name = {o.name: o for o in later.output}
    outputs = []
    for output in first.output:
        chosen = output
        if output.name.startswith("present.") and ".decoder." in output.name:
            chosen = later_by_name.get(output.name, output)
        outputs.append(onnx.helper.ValueInfoProto())
        outputs[-1].CopyFrom(chosen)
    return outputs


def _share_initializers(graphs: list[Any]) -> tuple[list[Any], dict[str, int]]:
    """The graphs' initializers (those not ``_stays``) grouped by dtype, dims and data: one of
    each group for the outer graph, under the first name of its group (suffixed where that name
    means something else in either graph); the graphs' uses renamed. The counts for the report."""
    from onnx import numpy_helper

    groups: dict[tuple[Any, ...], list[tuple[int, Any]]] = {}
    outputs = {o.name for g in graphs for o in g.output}
    for index, graph in enumerate(graphs):
        for init in graph.initializer:
            if _stays(init) or init.name in outputs:
                continue
            data = numpy_helper.to_array(init)
            key = (init.data_type, tuple(init.dims), hashlib.sha256(data.tobytes()).hexdigest())
            groups.setdefault(key, []).append((index, init))
    moved = [{init.name for members in groups.values() for i, init in members if i == index}
             for index in range(len(graphs))]  # fmt: skip
    defined = [_defined(g) for g in graphs]
    taken = set().union(*defined)
    # the names that stay: inputs, node outputs, initializers kept in a branch
    fixed = set().union(*(d - m for d, m in zip(defined, moved, strict=True)))
    renames: list[dict[str, str]] = [{} for _ in graphs]
    outer, used = [], set()
    counts = {"weights": 0, "shared": 0, "bytes": 0, "shared_bytes": 0}
    for members in groups.values():
        name = members[0][1].name
        if name in fixed or name in used:
            k = 0
            while f"{name}_merged_{k}" in taken:
                k += 1
            name = f"{name}_merged_{k}"
        taken.add(name)
        used.add(name)
        for index, init in members:
            renames[index][init.name] = name
        kept = members[0][1]
        kept.name = name
        outer.append(kept)
        size = len(kept.raw_data) or kept.ByteSize()
        counts["weights"] += 1
        counts["bytes"] += size
        if len({i for i, _ in members}) > 1:
            counts["shared"] += 1
            counts["shared_bytes"] += size
    for graph, renamed in zip(graphs, renames, strict=True):
        kept_here = [i for i in graph.initializer if _stays(i) or i.name in outputs]
        del graph.initializer[:]
        graph.initializer.extend(kept_here)
        _rename_uses(graph, renamed)
    return outer, counts


def _defined(graph: Any) -> set[str]:
    """Every value name ``graph`` defines: inputs, initializers, node outputs (subgraphs too)."""
    names = {v.name for v in graph.input} | {i.name for i in graph.initializer}
    for node in graph.node:
        names.update(node.output)
        for sub in _subgraphs(node):
            names |= _defined(sub)
    return names


def _subgraphs(node: Any) -> list[Any]:
    return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else list(a.graphs))]


def _rename_uses(graph: Any, renamed: dict[str, str]) -> None:
    """Node inputs renamed, in subgraphs (If, Loop, Scan bodies) too."""
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name in renamed:
                node.input[k] = renamed[name]
        for sub in _subgraphs(node):
            _rename_uses(sub, renamed)
