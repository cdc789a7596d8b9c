"""torch.export archives (``torch.export.save``) and AOTInductor packages: both PT2 zips.

A PT2 archive has ``<root>/archive_format`` = ``pt2``. An ExportedProgram archive holds
``models/<name>.json`` (the serialized program: signature, tensor metadata, symbolic dims) and
``data/weights``; an AOTInductor package holds ``data/aotinductor/<model>/`` with a compiled
shared library that runs native code when loaded.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ptconvert import _compat
from ptconvert.archive import ZipArchive, open_zip
from ptconvert.errors import CorruptFileError, UnsupportedConversionError
from ptconvert.formats.base import FileInfo, Format, IOSpec, Probe, Quantization, file_entry
from ptconvert.formats.checkpoint import PickledCheckpoint
from ptconvert.formats.checkpoint_weights import read_checkpoint_weights
from ptconvert.formats.program import Program, Signature, by_position
from ptconvert.formats.pt2.subclasses import pickled_weight
from ptconvert.formats.reference import Reference, program_reference
from ptconvert.formats.torch_objects import DTYPE_SIZES, StorageRef, TensorRef
from ptconvert.formats.weightset import WeightSet, weights_from_tensors

# torch._export.serde.schema.ScalarType
SCALAR_TYPES: dict[int, str] = {
    1: "uint8",
    2: "int8",
    3: "int16",
    4: "int32",
    5: "int64",
    6: "float16",
    7: "float32",
    8: "float64",
    9: "complex32",
    10: "complex64",
    11: "complex128",
    12: "bool",
    13: "bfloat16",
    28: "uint16",
    29: "float8_e4m3fn",
    30: "float8_e5m2",
    31: "float8_e4m3fnuz",
    32: "float8_e5m2fnuz",
    33: "float8_e8m0fnu",
    34: "uint32",
    35: "uint64",
}


_SYMBOL = re.compile(r"Symbol\('(\w+)'.*\)")


def is_pt2(probe: Probe) -> bool:
    z = probe.zip
    if z is None:
        return False
    member = next((m for m in z.members if m.name.endswith("archive_format")), None)
    return member is not None and z.read(member, 16).strip() == b"pt2"


def _dim(d: dict[str, Any]) -> int | str:
    if "as_int" in d:
        return int(d["as_int"])
    text = str(d.get("as_expr", {}).get("expr_str", "?"))
    m = _SYMBOL.fullmatch(text)  # "Symbol('s31', positive=True, integer=True)" → "s31"
    return m.group(1) if m else text


def _read_json(archive: ZipArchive, name: str, path: Path) -> Any:
    member = archive.member(name)
    if member is None:
        raise CorruptFileError(f"PT2 archive has no member {name}", path=path)
    try:
        return json.loads(archive.read(member))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptFileError(f"PT2 member {name} is not valid JSON ({exc})", path=path) from None


@dataclass(frozen=True)
class Payload:
    """One entry of a model's weights or constants config, as torch.export.load reads it."""

    model: str
    kind: str  # "weights" | "constants"
    fqn: str
    member: str  # the archive member it names
    pickled: bool  # handed to torch.load / pickle.loads, not viewed as raw bytes
    meta: Any  # tensor_meta of a raw payload


def payloads(archive: ZipArchive) -> list[Payload]:
    """Every payload of every model, from exactly the configs torch reads (``data/weights/
    {model}_weights_config.json``, ``data/constants/{model}_constants_config.json``); raises
    CorruptFileError for a config that is not what torch expects."""
    root = archive.root()
    models = sorted(
        n[len(root) + 7 : -5]
        for n in archive.names
        if n.startswith(root + "models/") and n.endswith(".json") and "/" not in n[len(root) + 7 :]
    )
    out: list[Payload] = []
    for model in models:
        for kind in ("weights", "constants"):
            folder = f"{root}data/{kind}/"
            member = archive.member(f"{folder}{model}_{kind}_config.json")
            if member is None:
                continue  # an older layout: data/<kind>/<model>.pt, a torch.save archive
            config = _read_json(archive, member.name, archive.path)
            entries = config.get("config") if isinstance(config, dict) else None
            if not isinstance(entries, dict):
                raise CorruptFileError(f"{member.name} has no config mapping", path=archive.path)
            for fqn, entry in entries.items():
                if not isinstance(entry, dict) or not isinstance(entry.get("path_name"), str):
                    raise CorruptFileError(
                        f"{member.name}: entry {fqn!r} is malformed", path=archive.path
                    )
                name = entry["path_name"]
                raw = not entry.get("use_pickle") and (
                    kind == "weights" or name.startswith("tensor_")
                )
                out.append(
                    Payload(model, kind, fqn, folder + name, not raw, entry.get("tensor_meta"))
                )
    return out


def weight_refs(path: Path) -> tuple[ZipArchive, dict[str, TensorRef]] | None:
    """The program's state dict as views into its raw weight members, from its weights config:
    what ``torch.export.load`` builds with ``as_strided``, without loading the program. None for
    the older layout whose weights are one torch.save archive."""
    archive = open_zip(path)
    entries = [p for p in payloads(archive) if p.kind == "weights"]
    models = sorted({p.model for p in entries})
    if not entries:
        return None
    model = "model" if "model" in models else models[0]
    refs: dict[str, TensorRef] = {}
    for p in (p for p in entries if p.model == model):
        if p.pickled:
            raise UnsupportedConversionError(
                f"weight {p.fqn!r} is stored as a pickle (a tensor subclass?): not read here",
                path=path,
            )
        refs[p.fqn] = _weight_ref(archive, p, path)
    return archive, refs


def _weight_ref(archive: ZipArchive, p: Payload, path: Path) -> TensorRef:
    meta = p.meta if isinstance(p.meta, dict) else {}
    try:
        dtype = SCALAR_TYPES.get(int(meta["dtype"]))
        shape = tuple(int(d["as_int"]) for d in meta["sizes"])
        stride = tuple(int(d["as_int"]) for d in meta["strides"])
        offset = int(meta["storage_offset"]["as_int"])
    except (KeyError, TypeError, ValueError):
        raise CorruptFileError(f"weight {p.fqn!r} has no concrete layout", path=path) from None
    member = archive.member(p.member)
    if dtype is None or member is None:
        raise CorruptFileError(f"weight {p.fqn!r}: unknown dtype or missing payload", path=path)
    if len(shape) != len(stride) or offset < 0 or min((*shape, *stride), default=0) < 0:
        raise CorruptFileError(f"weight {p.fqn!r} has an impossible layout", path=path)
    storage = StorageRef(member.name, dtype, member.size // DTYPE_SIZES[dtype], "cpu")
    return TensorRef(storage, shape, stride, offset, bool(meta.get("requires_grad")))


def saves_in_place() -> bool:
    """Whether this torch's save has the writer that ``edges/save.py``'s ``records_in_place``
    works with (the hook ``pt2_archive_writer``): told without importing torch, as it is asked
    before torch is imported."""
    from ptconvert._compat.pt2_archive import module_present

    return module_present()


class ExportedProgramFormat(Format):
    name = "pt2"
    kind = "program"
    suffixes = (".pt2",)
    loader_needs_suffix = True
    load_line = "prog = torch.export.load(p).module()"
    # the conversion's fresh interpreter: the same load, the weights mapped (no second copy)
    fresh_load_line = (
        "from ptconvert.formats.pt2 import mapped_weights\n"
        "with mapped_weights(p):\n    prog = torch.export.load(p).module()"
    )
    warm_line = "import torch.export.pt2_archive._package, ptconvert.formats.pt2"
    bounds_dims = True
    holds = "an ExportedProgram: ATen graph, signature with dynamic dims, weights, constants"
    priority = 30
    # torchao's int8 weight-only tensors export, save and load (torchao imported by the load)
    quantize_schemes = ("int8",)
    quantizes_module = True

    def open(self, path: Path, device: str = "cpu") -> Program:
        return open_exported(path)

    def match(self, probe: Probe) -> str | None:
        if not is_pt2(probe):
            return None
        names = probe.zip.names if probe.zip else []
        if any("/models/" in n and n.endswith(".json") for n in names):
            return "archive"
        return None

    read_label = "extract the weights"
    read_step = "program_weights"

    def writes_weights_in_place(self) -> bool:
        return saves_in_place()

    def read_weights(
        self, path: Path, layout: str, key: str | None, skip_unsupported: bool
    ) -> WeightSet:
        """Its parameters and buffers from the payload configs and the weight records, read
        symbolically; a .pt2 of the older layout (its weights in one torch.save archive inside)
        through torch.export.load, which the caller runs only on a scan-clean file."""
        found = weight_refs(path)
        if found is None:
            ws = weights_from_tensors(dict(load_exported(path).state_dict))
            ws.notes.append(
                "older .pt2 layout (data/weights/<model>.pt): read with torch.export.load"
            )
            return ws
        ckpt = PickledCheckpoint("zip", found[1], [], found[0])
        return read_checkpoint_weights(path, layout, key, skip_unsupported, program=True, ckpt=ckpt)

    def loads_to_read(self, path: Path, layout: str) -> bool:
        return weight_refs(path) is None

    def reference(self, ws: WeightSet, may_load: Callable[[], bool], stack: ExitStack) -> Reference:
        assert ws.origin is not None
        origin = ws.origin
        state = lambda: dict(load_exported(origin).state_dict)  # noqa: E731
        return program_reference(ws, may_load(), state, "torch.export.load(...).state_dict")

    def info(self, path: Path, layout: str) -> FileInfo:
        archive = open_zip(path)
        root = archive.root()
        models = [
            m.name
            for m in archive.members
            if m.name.startswith(root + "models/") and m.name.endswith(".json")
        ]
        info = FileInfo(str(path), self.name, layout, path.stat().st_size, [file_entry(path)])
        program = _read_json(archive, models[0], path)
        gm = program.get("graph_module", {})
        values = gm.get("graph", {}).get("tensor_values", {})
        sig = gm.get("signature", {})
        info.inputs = []
        for spec in sig.get("input_specs", []):
            if "user_input" in spec:
                arg = spec["user_input"]["arg"]
                info.inputs.append(_io(arg, values))
        info.outputs = [
            _io(spec["user_output"]["arg"], values)
            for spec in sig.get("output_specs", [])
            if "user_output" in spec
        ]
        _calling_convention(gm, program.get("range_constraints", {}), info)
        info.opset = {k: int(v) for k, v in program.get("opset_version", {}).items()}
        info.metadata["models"] = [m.rsplit("/", 1)[-1][:-5] for m in models]
        info.metadata["range_constraints"] = program.get("range_constraints", {})
        schema = program.get("schema_version", {})
        info.metadata["schema_version"] = f"{schema.get('major')}.{schema.get('minor')}"
        weights_cfg = next(
            (m.name for m in archive.members if m.name.endswith("_weights_config.json")), None
        )
        if weights_cfg is not None:
            cfg = _read_json(archive, weights_cfg, path).get("config", {})
            entries = []
            nbytes: dict[str, int] = {}  # a quantized weight's: its storages'
            quantized = Counter[str]()
            for pname, w in cfg.items():
                meta = w.get("tensor_meta", {})
                shape = [_dim(s) for s in meta.get("sizes", [])]
                dtype = SCALAR_TYPES.get(int(meta.get("dtype", 0)), "unknown")
                numel = math.prod(int(s) for s in shape if isinstance(s, int))
                label = _pickled(archive, weights_cfg, pname, w, info, nbytes)
                if label is not None:  # a quantized weight: named by its class, not its dtype
                    dtype, quantized[label] = label, quantized[label] + 1
                entries.append((pname, dtype, shape, numel))
            info.add_tensors(entries, nbytes=nbytes)
            if quantized:
                info.quantized = Quantization(weights=dict(sorted(quantized.items())))
        if any("sample_inputs/" in m.name for m in archive.members):
            info.notes.append("holds sample inputs (a torch.save pickle)")
        # torch registers builtins, collections and its own types: others need their module
        known = ("builtins.", "collections.", "torch.")
        foreign = sorted(t for t in pytree_types(path) if not t.startswith(known))
        if foreign:
            info.notes.append(
                f"its inputs or outputs are {', '.join(foreign)}: torch.export.load needs those "
                "types registered first (ptconvert registers transformers' own when it loads it)"
            )
        return info


def _pickled(
    archive: ZipArchive,
    config: str,
    pname: str,
    entry: dict[str, Any],
    info: FileInfo,
    nbytes: dict[str, int],
) -> str | None:
    """A quantized tensor subclass's label (its storages' bytes put in ``nbytes``) for a weight
    stored as one; None for another weight, with a note if it is a pickle nonetheless."""
    if not entry.get("use_pickle"):
        return None
    member = archive.member(config.rsplit("/", 1)[0] + "/" + str(entry.get("path_name")))
    found = pickled_weight(archive, member) if member is not None else None
    if found is None or not found.quantized:
        what = f" of {found.subclass}" if found is not None and found.subclass else ""
        info.notes.append(f"weight {pname!r} is stored as a pickle{what}")
        return None
    if found.nbytes is not None:
        nbytes[pname] = found.nbytes
    return found.label


def _spec(text: Any) -> dict[str, Any]:
    """A serialized treespec (``[1, {"type": …, "context": …, "children_spec": […]}]``)."""
    try:
        spec = json.loads(text)[1] if isinstance(text, str) else {}
    except (json.JSONDecodeError, IndexError, TypeError):
        return {}
    return spec if isinstance(spec, dict) else {}


def _keys(spec: dict[str, Any]) -> list[str]:
    try:
        keys = json.loads(spec.get("context") or "null")
    except json.JSONDecodeError:
        return []
    return [str(k) for k in keys] if isinstance(keys, list) else []


def _calling_convention(gm: dict[str, Any], ranges: dict[str, Any], info: FileInfo) -> None:
    """How a user calls the program (positionally or by keyword, the names, what it returns)
    and the sizes each dynamic input dim accepts, from the serialized signature."""
    calls = gm.get("module_call_graph") or [{}]
    sig = calls[0].get("signature") or {}
    inputs = _spec(sig.get("in_spec"))
    children = inputs.get("children_spec") or [{}, {}]
    keywords = _keys(children[1]) if len(children) > 1 else []
    names = [i.name for i in info.inputs or []]
    positional = names[: len(children[0].get("children_spec") or [])]
    args = positional + [f"{k}=…" for k in keywords]
    out = _spec(sig.get("out_spec"))
    keys = _keys(out) if out.get("type") == "builtins.dict" else []
    if info.outputs and len(keys) == len(info.outputs):  # named as the caller sees them
        info.outputs = [
            IOSpec(k, o.dtype, o.shape) for k, o in zip(keys, info.outputs, strict=True)
        ]
    returned = (
        f"dict[{', '.join(_keys(out))}]"
        if out.get("type") == "builtins.dict"
        else str(out.get("type") or "a tensor").removeprefix("builtins.")
    )
    info.metadata["call"] = f"prog({', '.join(args)}) → {returned}"
    accepts = []
    for spec in info.inputs or []:
        for axis, dim in enumerate(spec.shape or []):
            bound = ranges.get(dim) if isinstance(dim, str) else None
            if isinstance(bound, dict):
                low, high = bound.get("min_val"), bound.get("max_val")
                span = f"{low} or more" if high is None else f"{low}–{high}"
                accepts.append(f"{spec.name} dim {axis}: {span} (as torch guarantees)")
    info.metadata["accepts"] = accepts or ["only the shapes above (no dynamic dims)"]


def _io(arg: dict[str, Any], values: dict[str, Any]) -> IOSpec:
    if "as_tensor" in arg:
        name = arg["as_tensor"]["name"]
        meta = values.get(name, {})
        return IOSpec(
            name,
            SCALAR_TYPES.get(int(meta.get("dtype", 0)), "unknown"),
            [_dim(s) for s in meta.get("sizes", [])],
        )
    kind = next(iter(arg), "unknown")
    value = arg.get(kind)
    label = value.get("name", kind) if isinstance(value, dict) else kind
    return IOSpec(str(label), kind, None)


@contextlib.contextmanager
def without_stack_traces(ep: Any, keep: bool = False) -> Iterator[None]:
    """``ep``'s nodes without their stack traces while the block runs (``--keep-debug-info``:
    ``keep``, left as they are). ``torch.export.save`` writes each node's trace into the
    archive: the absolute path of every source file on the way (the converting machine's home,
    project and venv), most of a small program's JSON. They are put back after: the program
    in memory is the same one."""
    taken: list[tuple[Any, Any]] = []
    if not keep:
        for module in ep.graph_module.modules():  # subgraphs (torch.cond branches) included
            nodes = getattr(getattr(module, "graph", None), "nodes", ())
            taken += [(n, n.meta.pop("stack_trace")) for n in nodes if "stack_trace" in n.meta]
    try:
        yield
    finally:
        for node, trace in taken:
            node.meta["stack_trace"] = trace


def open_exported(path: Path) -> Program:
    """A pt2 file as a program: called by keyword when it was exported so, else by position."""
    return program_from_exported(load_exported(path))


def program_from_exported(ep: Any) -> Program:
    """An ExportedProgram (loaded, or just exported) as a program called on named inputs."""
    names = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    args_spec, kwargs_spec = (
        ep.call_spec.in_spec.children() if ep.call_spec.in_spec else (None, None)
    )
    keywords = list(getattr(kwargs_spec, "context", None) or [])
    if keywords:  # the keyword inputs by the names they are called with
        names = [*names[: getattr(args_spec, "num_children", 0)], *keywords]
    module = ep.module()

    def call_of(m: Any) -> Callable[..., Any]:
        return m if keywords else by_position(m, names)

    return Program(
        call_of(module),
        Signature(names, list(names), source="program inputs"),
        module,
        call_of,
        ep,
        bool(ep.range_constraints),
        _max_batch(ep),
    )


def _max_batch(ep: Any) -> int | None:
    """The finite upper bound of the first user input's dim 0, when it is dynamic."""
    users = {s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"}
    for node in ep.graph.nodes:
        if node.op != "placeholder" or node.name not in users:
            continue
        shape = getattr(node.meta.get("val"), "shape", None)
        expr = getattr(getattr(shape[0], "node", None), "expr", None) if shape else None
        bound = ep.range_constraints.get(expr) if expr is not None else None
        if bound is None or "oo" in str(bound.upper):  # unbounded (sympy's int_oo)
            return None
        upper = int(bound.upper)
        return upper if upper is not None and upper < 1 << 20 else None
    return None


# a type inside a treespec: the specs are JSON strings within the JSON, so their quotes are escaped
_TREESPEC_TYPE = re.compile(r'\\+"type\\+":\s*\\+"([A-Za-z_][\w.]*)\\+"')


def pytree_types(path: Path) -> set[str]:
    """The Python types the program's input and output specs name (``builtins.dict``,
    ``transformers.modeling_outputs.BaseModelOutput`` …), read from its serialized JSON."""
    archive = open_zip(path)
    root = archive.root()
    found: set[str] = set()
    for member in archive.members:
        if member.name.startswith(root + "models/") and member.name.endswith(".json"):
            found.update(_TREESPEC_TYPE.findall(archive.read(member).decode("utf-8", "replace")))
    return found


def load_exported(path: Path) -> Any:
    """``torch.export.load`` of a file the scan has cleared, with the pytree types its specs
    name registered first. A program exported from a transformers model names its ModelOutput
    classes; those register themselves when their module is imported. Only transformers'
    modules are imported for this: a name in a file never chooses what code runs."""
    import importlib

    import torch

    from ptconvert.deps import require
    from ptconvert.quiet import quiet_torch

    registered = _compat.torch_api.pytree().SERIALIZED_TYPE_TO_PYTHON_TYPE
    for name in sorted(pytree_types(path) - set(registered)):
        module = name.rpartition(".")[0]
        if module.split(".")[0] != "transformers":
            raise UnsupportedConversionError(
                f"the program's inputs or outputs are {name}, a Python type that torch can only "
                "rebuild by importing its module; ptconvert imports transformers' output types "
                "only",
                path=path,
                hint="export with plain tensors, tuples or dicts as inputs and outputs",
            )
        require("transformers")
        with contextlib.suppress(ImportError):  # a ModelOutput registers itself when defined
            importlib.import_module(module)
        if name not in registered:
            raise UnsupportedConversionError(
                f"the program's output type {name} is not in the installed transformers",
                path=path,
                hint="install the transformers version the program was exported with",
            )
    with quiet_torch(), mapped_weights(path):  # torch logs a page per problem
        try:
            return torch.export.load(path)
        except Exception as exc:  # torch raises RuntimeError and others for unreadable programs
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            raise UnsupportedConversionError(
                f"torch.export.load cannot read this program: {type(exc).__name__}: {first}",
                path=path,
            ) from None


@contextlib.contextmanager
def mapped_weights(path: str | Path) -> Iterator[None]:
    """``torch.export.load`` of ``path`` within takes its weights and constants as tensors over
    a private map of the file instead of copies (torch 2.13's loader reads every record into
    memory: a second full copy of the weights beside the model that was just exported). The
    records are stored uncompressed, 64-byte aligned; the map is copy-on-write, so a program
    that changes a buffer changes its own page, never the file. Everything else is
    torch.export.load's own reading. Other archives opened meanwhile are read as usual."""
    import mmap

    import torch

    target = os.path.realpath(path)
    with open(target, "rb") as fh:
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)

    def wrap(archive: Any, reader: Any) -> Any:
        if isinstance(archive, (str, os.PathLike)) and os.path.realpath(archive) == target:
            return _MappedRecords(reader, mapped, torch)
        return reader

    # the hook pt2_archive_reader (ptconvert/_compat): without it, torch's own reading
    with _compat.patched("pt2_archive_reader", wrap=wrap):
        yield


class _MappedRecords:
    """torch's archive reader, whose tensor records are views of the file's map."""

    def __init__(self, reader: Any, mapped: Any, torch: Any) -> None:
        self._reader, self._mapped, self._torch = reader, mapped, torch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)

    def get_storage_from_record(self, name: str, numel: int, dtype: Any) -> Any:
        offset = self._reader.get_record_offset(name)
        size = self._reader.get_record_size(name)
        if numel * dtype.itemsize != size or offset % dtype.itemsize:
            return self._reader.get_storage_from_record(name, numel, dtype)
        return self._torch.frombuffer(self._mapped, dtype=dtype, count=numel, offset=offset)
