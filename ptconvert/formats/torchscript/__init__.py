"""TorchScript archives (torch.jit.save): ``code/`` with the module's TorchScript source,
``data.pkl`` with its attributes and ``constants.pkl``.

Weights and the forward signature are read without loading the module: the attribute pickle goes
through the symbolic machine and the signature is parsed from the serialized TorchScript code.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ptconvert.archive import ZipArchive, open_zip
from ptconvert.errors import CorruptFileError
from ptconvert.formats.base import FileInfo, Format, IOSpec, Probe, file_entry
from ptconvert.formats.checkpoint import PickledCheckpoint, describe_pickles, read_checkpoint
from ptconvert.formats.checkpoint_weights import read_checkpoint_weights
from ptconvert.formats.program import Program, Signature, by_position
from ptconvert.formats.reference import Reference, program_reference
from ptconvert.formats.torch_objects import TensorRef, flatten_tensors, interpret
from ptconvert.formats.weightset import WeightSet
from ptconvert.pickles.machine import run_pickle

_DEF_FORWARD = re.compile(r"def forward\(self[^,)]*(?P<args>[^)]*)\)\s*->\s*(?P<ret>[^:]+):", re.S)


class TorchScriptFormat(Format):
    name = "torchscript"
    suffixes = (".pt", ".pth", ".ts", ".jit")
    holds = "a compiled module: TorchScript code, weights and constants; runs without Python source"
    priority = 20
    kind = "program"
    output_suffix = ".ts.pt"
    load_line = "prog = torch.jit.load(p)"
    quantize_why = "torchao's int8 tensors cannot be scripted or traced into TorchScript"

    def match(self, probe: Probe) -> str | None:
        z = probe.zip
        if z is None or not probe.zip_has("data.pkl"):
            return None
        if probe.zip_has("constants.pkl") or any("/code/" in n for n in z.names):
            return "zip"
        return None

    read_label = "extract the weights"
    read_step = "program_weights"

    def read_weights(
        self, path: Path, layout: str, key: str | None, skip_unsupported: bool
    ) -> WeightSet:
        """Its ``state_dict()`` (parameters and buffers), from the attributes pickle read
        symbolically (the program is never loaded for its weights); other tensor attributes
        (runtime state) are named in a note, not written."""
        ckpt = read_checkpoint(path, layout)
        tree, dropped = module_state(ckpt) if key is None else (ckpt.tree, [])
        ws = read_checkpoint_weights(
            path, layout, key, skip_unsupported, program=True, ckpt=replace(ckpt, tree=tree)
        )
        if dropped:
            ws.notes.append(
                f"{len(dropped)} tensor attributes that are not parameters or buffers left out "
                f"(the module's state_dict() does not hold them): {', '.join(dropped[:10])}"
            )
        return ws

    def reference(self, ws: WeightSet, may_load: Callable[[], bool], stack: ExitStack) -> Reference:
        def state() -> dict[str, Any]:
            import torch

            from ptconvert.formats.torchscript.probe import load_in_time

            assert ws.origin is not None
            load_in_time(ws.origin)  # bounded (the caller gave --load-timeout first, if known)
            return dict(torch.jit.load(str(ws.origin), map_location="cpu").state_dict())

        return program_reference(ws, may_load(), state, "torch.jit.load(...).state_dict()")

    def info(self, path: Path, layout: str) -> FileInfo:
        archive = open_zip(path)
        root = archive.root()
        data = archive.member(root + "data.pkl")
        if data is None:
            raise CorruptFileError("TorchScript archive has no data.pkl", path=path)
        run = run_pickle(archive.read(data))
        if run.error:
            raise CorruptFileError(f"{data.name} cannot be parsed: {run.error}", path=path)
        tree = interpret(run.root, root + "data/")
        info = FileInfo(str(path), self.name, layout, path.stat().st_size, [file_entry(path)])
        info.add_tensors(
            (k, t.dtype, list(t.shape), t.numel)
            for k, t in flatten_tensors(tree).items()
            if isinstance(t, TensorRef)
        )
        describe_pickles(info, [run])
        # classes under __torch__ are TorchScript's own: they need no Python code to load
        info.needs_code = [n for n in info.needs_code if not n.startswith("__torch__.")]
        root_cls = next((g for g in run.imports if (g.module or "").startswith("__torch__")), None)
        if root_cls is not None:
            info.metadata["module"] = f"{root_cls.module}.{root_cls.name}"
            code_path = root + "code/" + (root_cls.module or "").replace(".", "/") + ".py"
            member = archive.member(code_path)
            if member is not None:
                self._signature(info, archive.read(member).decode("utf-8", "replace"))
        return info

    def load_in_time(self, path: Path, timeout: float | None) -> None:
        from ptconvert.formats.torchscript.probe import load_in_time

        load_in_time(path, timeout)

    def open(self, path: Path, device: str = "cpu") -> Program:
        import torch

        from ptconvert.formats.torchscript.probe import load_in_time

        load_in_time(path)  # bounded (the caller gave --load-timeout first, if known)
        ts = torch.jit.load(str(path), map_location="cpu")  # in-process: beside eager
        args = ts.forward.schema.arguments[1:]
        names = [a.name for a in args]
        required = [a.name for a in args if not a.has_default_value()]
        return Program(
            by_position(ts, names),
            Signature(names, required, source="TorchScript forward"),
            ts,
            lambda m: by_position(m, names),
        )

    @staticmethod
    def _signature(info: FileInfo, code: str) -> None:
        m = _DEF_FORWARD.search(code)
        if m is None:
            return
        info.inputs = []
        for part in _split_args(m.group("args")):
            name, _, annotation = part.partition(":")
            info.inputs.append(IOSpec(name.strip(), annotation.strip() or None, None))
        info.outputs = [IOSpec("output", " ".join(m.group("ret").split()), None)]
        names = [i.name for i in info.inputs if i.name != "self"]
        info.metadata["call"] = f"prog({', '.join(names)}), positionally or by keyword"


# a module class of the serialized code: ``class Linear(Module):`` and its indented body
_CLASS = re.compile(r"^class (\w+)\(Module\):\n((?:[ \t].*\n?)*)", re.M)
_STATE = re.compile(r"^\s+__(?:parameters|buffers)__ = \[([^\]]*)\]", re.M)
_SUBMODULE = re.compile(
    r'^\s+(?:(\w+) :|__annotations__\["([^"]+)"\] =) (__torch__\.[\w.]+)\s*$', re.M
)


@dataclass
class _ModuleClass:
    state: set[str] = field(default_factory=set)  # __parameters__ and __buffers__
    submodules: dict[str, str] = field(default_factory=dict)  # attribute → class


def _module_classes(archive: ZipArchive, root: str) -> dict[str, _ModuleClass]:
    """Every module class of the archive's code, by qualified name (``__torch__.x.Vad``)."""
    classes: dict[str, _ModuleClass] = {}
    code = root + "code/"
    for member in archive.members:
        if not (member.name.startswith(code) and member.name.endswith(".py")):
            continue
        module = member.name[len(code) : -3].replace("/", ".")
        text = archive.read(member).decode("utf-8", "replace")
        for m in _CLASS.finditer(text):
            cls = classes.setdefault(f"{module}.{m.group(1)}", _ModuleClass())
            for names in _STATE.findall(m.group(2)):
                cls.state.update(re.findall(r'"([^"]+)"', names))
            for attr, numbered, type_name in _SUBMODULE.findall(m.group(2)):
                cls.submodules[attr or numbered] = type_name
    return classes


def module_state(ckpt: PickledCheckpoint) -> tuple[Any, list[str]]:
    """A TorchScript archive's attribute tree cut to its ``state_dict()``: parameters, buffers
    and submodules. Other tensor attributes (silero-vad's ``self._state``, runtime state that
    ``torch.jit.load(...).state_dict()`` does not hold) are left out and returned by name. The
    tree as it is when the code does not say which are which."""
    root_cls = next((g for g in ckpt.imports if (g.module or "").startswith("__torch__")), None)
    if ckpt.archive is None or root_cls is None:
        return ckpt.tree, []
    classes = _module_classes(ckpt.archive, ckpt.archive.root())
    root_name = f"{root_cls.module}.{root_cls.name}"
    if root_name not in classes:
        return ckpt.tree, []
    dropped: list[str] = []

    def cut(node: Any, cls_name: str, prefix: str) -> Any:
        cls = classes.get(cls_name)
        if cls is None or not isinstance(node, dict):
            return node
        kept: dict[Any, Any] = {}
        for key, value in node.items():
            if key in cls.submodules:
                kept[key] = cut(value, cls.submodules[key], f"{prefix}{key}.")
            elif key in cls.state or not flatten_tensors(value):
                kept[key] = value
            else:
                dropped.extend(f"{prefix}{name}" for name in flatten_tensors(value, f"{key}."))
        return kept

    return cut(ckpt.tree, root_name, ""), dropped


def _split_args(text: str) -> list[str]:
    """Split ``a: Tensor, b: Tuple[Tensor, int]`` at top-level commas."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[("
        depth -= ch in "])"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]
