"""Hugging Face model directories: ``config.json`` plus weights in any format the registry knows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ptconvert.errors import ModelDefinitionError
from ptconvert.formats.base import FileInfo, Format, Probe, file_entry
from ptconvert.formats.sharded import shard_paths

# Weight files transformers looks for, in its order of preference.
WEIGHT_NAMES = (
    "model.safetensors.index.json",
    "model.safetensors",
    "pytorch_model.bin.index.json",
    "pytorch_model.bin",
)


def weights_file(directory: Path) -> Path | None:
    """The weights transformers would load from ``directory``, or None."""
    for name in WEIGHT_NAMES:
        if (directory / name).is_file():
            return directory / name
    return None


# A generation export's folder (``--task text2text-generation-with-past``): config.json, an
# encoder and a decoder, no weights file; the layout named after what the parts are. (A
# decoder alone in optimum's folder, model.onnx beside config.json, is an ONNX file's folder:
# the ONNX format detects it.)
GENERATION_PARTS = {
    "seq2seq-pt2": (("encoder.pt2",), ("decoder.pt2",)),
    # optimum's layouts: the decoder unmerged (decoder_model + decoder_with_past_model) or merged
    "seq2seq-onnx": (
        ("encoder_model.onnx",),
        ("decoder_model.onnx", "decoder_model_merged.onnx", "decoder_with_past_model.onnx"),
    ),
}


def generation_layout(directory: Path) -> str | None:
    """``seq2seq-pt2`` / ``seq2seq-onnx`` for a generation export's folder (config.json, no
    weights file, an encoder and a decoder, by their file names), else None."""
    if not (directory / "config.json").is_file() or weights_file(directory):
        return None
    for name, (encoders, decoders) in GENERATION_PARTS.items():
        if any((directory / e).is_file() for e in encoders) and any(
            (directory / d).is_file() for d in decoders
        ):
            return name
    return None


def _names(names: list[str]) -> str:
    """Input or output names, a cache's ``past_key_values.N.…`` / ``present.N.…`` as one."""
    cache = [n for n in names if n.startswith(("past_key_values.", "present."))]
    shown = [n for n in names if n not in cache]
    if cache:
        shown.append(f"{cache[0].split('.')[0]}.N.… ({len(cache)})")
    return ", ".join(shown)


def read_config(directory: Path) -> dict[str, Any]:
    """config.json as a dict: anything else defines no model (a ModelDefinitionError)."""
    path = directory / "config.json"
    try:
        config = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelDefinitionError(
            f"config.json is not valid JSON ({exc})", path=path, hint=_CONFIG_HINT
        ) from None
    if not isinstance(config, dict):
        raise ModelDefinitionError(
            f"config.json is not a JSON object (it holds a {type(config).__name__})",
            path=path,
            hint=_CONFIG_HINT,
        )
    return config


_CONFIG_HINT = "restore the model's config.json (the one its weights were saved with)"


def remote_code(config: dict[str, Any]) -> list[str]:
    """The classes of the directory's own code that ``auto_map`` (``modeling_x.XModel``;
    ``repo--modeling_x.XModel`` for another repository's) or ``custom_pipelines`` (its
    ``impl``) names: transformers imports, so runs, their files under ``trust_remote_code``."""
    names: set[str] = set()
    auto_map = config.get("auto_map")
    for value in auto_map.values() if isinstance(auto_map, dict) else ():
        for name in value if isinstance(value, list) else [value]:  # a tokenizer's: [slow, fast]
            if isinstance(name, str) and name:
                names.add(name)
    pipelines = config.get("custom_pipelines")  # {task: {"impl": "pipeline_x.Pipe", …}}
    for task in pipelines.values() if isinstance(pipelines, dict) else ():
        impl = task.get("impl") if isinstance(task, dict) else None
        if isinstance(impl, str) and impl:
            names.add(impl)
    return sorted(names)


class HuggingFaceFormat(Format):
    name = "hf"
    # converting a directory's weights writes a directory, config.json included
    written_by = "--to safetensors on a Hugging Face directory"
    carries_model_spec = True
    suffixes = ()
    holds = "a transformers model directory: config.json, weights (any layout), tokenizer files"
    # above an ONNX client folder (model.onnx beside config.json), which a directory holding
    # weights and a model.onnx too also is
    priority = 11

    def match(self, probe: Probe) -> str | None:
        if probe.is_dir and (probe.path / "config.json").is_file() and weights_file(probe.path):
            return "directory"
        return None

    read_label = "read the directory's weights"

    def weights_file(self, path: Path) -> Path | None:
        return weights_file(path)

    def output_is_directory(self, path: Path, layout: str) -> bool:
        return True

    def kept_files(self, path: Path) -> list[Path]:
        skip = set(WEIGHT_NAMES)
        for name in WEIGHT_NAMES:
            if name.endswith(".index.json") and (path / name).exists():
                skip |= {p.name for p in shard_paths(path / name)}
        return [p for p in sorted(path.iterdir()) if p.name not in skip and p.is_file()]

    def info(self, path: Path, layout: str) -> FileInfo:
        config = read_config(path)
        if layout in GENERATION_PARTS:
            return self.generation_info(path, layout, config)
        weights = weights_file(path)
        assert weights is not None
        sub = self.describe_part(weights)  # the registry describes the weights
        info = FileInfo(str(path), self.name, layout, 0)
        info.files = [file_entry(p) for p in sorted(path.iterdir()) if p.is_file()]
        info.size_bytes = sum(f["size_bytes"] for f in info.files)
        info.metadata = {
            "model_type": config.get("model_type"),
            "architectures": config.get("architectures"),
            "dtype": config.get("dtype", config.get("torch_dtype")),
            "weights": weights.name,
            "weights_format": f"{sub.format}/{sub.layout}",
        }
        info.shards = sub.shards
        info.globals, info.needs_code = sub.globals, sub.needs_code
        if code := remote_code(config):  # auto_map: the directory's own code runs to load it
            info.metadata["remote_code"] = code
            info.needs_code = sorted({*info.needs_code, *code})
        info.merge_tensors(sub)
        return info

    def generation_info(self, path: Path, layout: str, config: dict[str, Any]) -> FileInfo:
        """A generation export's folder (``describe`` takes it; ``detect`` does not: nothing
        converts from it): its files, and each part (the encoder, the decoder) as the registry
        describes it, format and call. The task and the cache are generation/tasks.py's lines
        (``describe_task``)."""
        info = FileInfo(str(path), self.name, layout, 0)
        info.files = [file_entry(p) for p in sorted(path.iterdir()) if p.is_file()]
        info.size_bytes = sum(f["size_bytes"] for f in info.files)
        parts: dict[str, str] = {}
        encoders, decoders = GENERATION_PARTS[layout]
        for name in (*encoders, *decoders):
            if not (path / name).is_file():
                continue
            sub = self.describe_part(path / name)
            inputs = _names([i.name for i in sub.inputs or []])
            # a pt2's outputs are named after graph nodes: their count says enough
            outputs = (
                _names([o.name for o in sub.outputs or []])
                if sub.format == "onnx"
                else f"{len(sub.outputs or [])} output(s)"
            )
            parts[name] = f"{sub.format}: {inputs or '?'} → {outputs or '?'}"
            info.globals = sorted({*info.globals, *sub.globals})
            info.needs_code = sorted({*info.needs_code, *sub.needs_code})
            info.native_code += sub.native_code
        info.metadata = {
            "model_type": config.get("model_type"),
            "architectures": config.get("architectures"),
            "dtype": config.get("dtype", config.get("torch_dtype")),
            **parts,  # each part's file name: its format and call
        }
        info.notes.append(
            "a generation export (an encoder and a decoder driven by a loop): "
            "ptconvert.generate and ptconvert bench take the folder"
        )
        return info
