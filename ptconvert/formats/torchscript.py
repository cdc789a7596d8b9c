"""TorchScript archives (torch.jit.save): ``code/`` with the module's TorchScript source,
``data.pkl`` with its attributes and ``constants.pkl``.

Weights and the forward signature are read without loading the module: the attribute pickle goes
through the symbolic machine and the signature is parsed from the serialized TorchScript code.
"""

from __future__ import annotations

import re
from pathlib import Path

from ptconvert.archive import open_zip
from ptconvert.errors import CorruptFileError
from ptconvert.formats.base import FileInfo, Format, IOSpec, Probe, file_entry
from ptconvert.formats.checkpoint import describe_pickles
from ptconvert.formats.program import Program, Signature, by_position
from ptconvert.formats.torch_objects import TensorRef, flatten_tensors, interpret
from ptconvert.scan.machine import run_pickle

_DEF_FORWARD = re.compile(r"def forward\(self[^,)]*(?P<args>[^)]*)\)\s*->\s*(?P<ret>[^:]+):", re.S)


class TorchScriptFormat(Format):
    name = "torchscript"
    suffixes = (".pt", ".pth", ".ts", ".jit")
    holds = "a compiled module: TorchScript code, weights and constants; runs without Python source"
    priority = 20
    kind = "program"
    output_suffix = ".ts.pt"
    load_line = "prog = torch.jit.load(p)"

    def match(self, probe: Probe) -> str | None:
        z = probe.zip
        if z is None or not probe.zip_has("data.pkl"):
            return None
        if probe.zip_has("constants.pkl") or any("/code/" in n for n in z.names):
            return "zip"
        return None

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

    def open(self, path: Path, device: str = "cpu") -> Program:
        import torch

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
