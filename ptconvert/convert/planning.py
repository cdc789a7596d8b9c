"""The route a conversion would take before anything is loaded: the needs the options meet,
the edges a source cannot take, the plan with its dynamic dims named from the config, and the
memory it will need against what the machine has (refused without ``--force-memory``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ptconvert.convert.graph import Edge, Plan, edges, plan
from ptconvert.convert.output_naming import byte_copy
from ptconvert.convert.same_format import copy_cannot_change
from ptconvert.errors import (
    PtconvertError,
)
from ptconvert.formats import FORMATS_BY_NAME, Detection, describe, detect
from ptconvert.model.build import user_inputs
from ptconvert.options import Options
from ptconvert.scan.guard import refuse_unsafe

if TYPE_CHECKING:
    pass


def available_needs(src_format: str, opts: Options) -> frozenset[str]:
    from ptconvert.convert.needs import available

    return available(src_format, opts)


def inapplicable(d: Detection, to: str) -> frozenset[Edge]:
    """Edges that do not fit this file and target: a state dict is not a pickled module, and
    back; a program's weights are read symbolically on the way to a weights file (byte copies
    checked bitwise), its loaded state dict on the way to a model (the parity reference and its
    sample inputs come with it). A weights file is read symbolically whatever its pickle holds
    (a whole module's tensors too): nothing is loaded."""
    banned: set[Edge] = set()
    weights = byte_copy(d.format, to)
    if d.handler.reads_weights and d.handler.read_step != "read_weights":
        unused = d.handler.read_step if weights else "read_weights"
        banned |= {e for e in edges() if e.src == d.format and e.step == unused}
    if weights or not d.handler.may_hold_module:
        return frozenset(banned)
    whole_module = bool(describe(d.path).needs_code)
    kind = "weights" if whole_module else "module"
    return frozenset(banned | {e for e in edges() if e.src == d.format and e.dst == kind})


def plan_for(src: str | Path, to: str, opts: Options) -> Plan:
    """The route ``convert`` would take, after the same checks of the options it makes."""
    opts.validate()
    user_inputs(opts)  # a malformed --input is said here, as the conversion would say it
    refuse_unsafe(src)
    d = detect(src)
    if d.format == to and Path(src).is_file() and not byte_copy(d.format, to):
        copy_cannot_change(Path(src), to, opts)
        copy = Edge(to, to, "copy", 0, label="a byte copy, compared with the source")
        return Plan(to, to, [copy], source=str(src))
    result = plan(d.format, to, available_needs(d.format, opts), inapplicable(d, to))
    if to in FORMATS_BY_NAME:
        FORMATS_BY_NAME[to].refuse_source(Path(src))  # what the target cannot hold, said first
    result.source = str(src)
    estimate_memory(result, d, opts)
    result.dynamic = _planned_dims(result, d, opts)
    return result


def _planned_dims(route: Plan, d: Detection, opts: Options) -> dict[str, str]:
    """What ``--dynamic-batch``/``--dynamic`` will make dynamic, in words, before the model is
    loaded (the conversion's report says what held): a Hugging Face model's family axes with
    the longest its config.json allows."""
    from ptconvert.model.axes import planned_axes
    from ptconvert.options import DYNAMIC_SPEC

    if not any(e.dst == "exported" for e in route.edges):
        return {}
    out: dict[str, str] = {}
    if opts.dynamic_batch:
        out["batch"] = "dim 0 of every tensor input, 1 or more (checked after the conversion)"
    for spec in opts.dynamic:
        m = DYNAMIC_SPEC.match(spec)
        if m is not None:
            span = f"{m['min']}–{m['max']}" if m["min"] else "any size torch allows"
            out[f"{m['name']} dim {m['axis']}"] = span
    config = d.path / "config.json" if d.handler.carries_model_spec else None
    if opts.dynamic_batch and not opts.static_sequence and config is not None:
        out.update(planned_axes(_json_config(config)))
    return out


class _JsonConfig:
    """config.json as attributes, as ``model.inputs`` reads a transformers config."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.model_type = data.get("model_type")
        for key, value in data.items():
            is_sub = isinstance(value, dict) and "model_type" in value
            setattr(self, key, _JsonConfig(value) if is_sub else value)

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _json_config(path: Path) -> Any:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    return _JsonConfig(data if isinstance(data, dict) else {})


def estimate_memory(route: Plan, d: Detection, opts: Options) -> None:
    """A route that builds the model: its peak memory estimated from the size of the weights
    the conversion reads (the --key entry, not a training checkpoint's optimizer state), read
    symbolically, before anything is loaded."""
    from ptconvert.memory import available_bytes, program_estimate
    from ptconvert.weights.read import read_weights

    if not any(e.dst in ("module", "exported") for e in route.edges):
        return
    try:
        weights = read_weights(d.path, key=opts.key, skip_unsupported=True)
        weight_bytes = sum(e.nbytes for e in weights.stored)
    except PtconvertError:  # a whole pickled module, or a program: its size on disk
        weight_bytes = describe(d.path).size_bytes
    route.weight_bytes = weight_bytes
    target = FORMATS_BY_NAME.get(route.dst)
    maps = target is not None and bool(target.fresh_load_line)  # pt2: its check maps the file
    route.memory_estimate_bytes = program_estimate(
        weight_bytes, verify=opts.verify, copy_runs=not maps
    )
    route.memory_available_bytes = available_bytes()


def check_memory(route: Plan, opts: Options, src: Path) -> None:
    need, free = route.memory_estimate_bytes, route.memory_available_bytes
    if need is None or free is None or need <= free or opts.force_memory:
        return
    from ptconvert.errors import MissingRequirementError

    raise MissingRequirementError(
        f"converting this model needs about {need / 2**30:.1f} GiB of memory and "
        f"{free / 2**30:.1f} GiB is available",
        path=src,
        hint="free memory or use a larger machine; --force-memory tries anyway",
    )
