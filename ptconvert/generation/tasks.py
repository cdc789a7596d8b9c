"""Which generation task a model fits, and what ``plan``/``info`` say about a directory."""

from __future__ import annotations

from typing import Any

from ptconvert.errors import UnsupportedConversionError, UsageError
from ptconvert.options import GENERATION_TASKS

FOLDER_KINDS = ("seq2seq", "speech-seq2seq")  # an encoder and a decoder: written as a folder


def target_names(kind: str) -> list[str]:
    """The targets a kind of model is written to for its generation task: those the formats
    declare for its layout (a seq2seq or speech model: a folder; a decoder: one file)."""
    from ptconvert.generation.targets import targets

    return list(targets("seq2seq" if kind in FOLDER_KINDS else "decoder"))


def is_generation_task(task: str | None) -> bool:
    return task in GENERATION_TASKS


def kind_of(config: Any) -> str | None:
    """``decoder`` (a causal LM), ``seq2seq``/``speech-seq2seq`` (an encoder-decoder), or None,
    from the directory's config (``architectures``, ``is_encoder_decoder``)."""
    names = list(getattr(config, "architectures", None) or [])
    if getattr(config, "is_encoder_decoder", False):
        speech = any("SpeechSeq2Seq" in n or "Whisper" in n for n in names)
        return "speech-seq2seq" if speech else "seq2seq"
    if any(n.endswith(("ForCausalLM", "LMHeadModel")) for n in names):
        return "decoder"
    return None


def tasks_of(config: Any) -> list[str]:
    """The optimum task names this config exports as: the default first (``info`` shows them).
    The default stays the cache-free graph (``text-generation``): ``--task …-with-past`` asks
    for the cache."""
    kind = kind_of(config)
    if kind == "decoder":
        return ["text-generation", "text-generation-with-past"]
    if kind == "seq2seq":
        return ["text2text-generation", "text2text-generation-with-past"]
    if kind == "speech-seq2seq":
        return ["automatic-speech-recognition", "automatic-speech-recognition-with-past"]
    return ["feature-extraction"]


def refuse_precision(opts: Any, path: Any) -> None:
    """``--dtype`` or ``--quantize`` on a generation export, refused before any work: the cache
    wrappers and the check by generating are for the model's own precision only for now."""
    asked = [
        f"--{name} {getattr(opts, name)}" for name in ("dtype", "quantize") if getattr(opts, name)
    ]
    if asked:
        raise UnsupportedConversionError(
            f"{' '.join(asked)} is not there yet for --task {opts.task}: generation exports are "
            "written in the model's own precision",
            path=path,
            hint=f"convert without --task …-with-past (the graph without a cache) to use "
            f"{asked[0].split()[0]}",
        )


def refuse_trace_exporter(opts: Any, path: Any) -> None:
    """``--onnx-exporter torchscript`` on a seq2seq generation export, refused before any work:
    its encoder and decoders go through torch.export (a decoder with past is traced,
    ``past._traced``)."""
    from ptconvert.formats.onnx.options import OnnxOptions

    if opts.of(OnnxOptions).onnx_exporter != "dynamo" and GENERATION_TASKS[opts.task] in (
        FOLDER_KINDS
    ):
        raise UsageError(
            f"--onnx-exporter torchscript is not available for --task {opts.task}: its encoder "
            "and decoders are exported through torch.export and the dynamo exporter",
            path=path,
            hint="leave --onnx-exporter out",
        )


def check_task(task: str, to: str, config: Any, path: Any) -> str:
    """The kind of model ``task`` exports, after checking that the directory holds one and that
    ``to`` is a target the task writes; a named error otherwise."""
    kind = GENERATION_TASKS[task]
    targets = target_names(kind)
    if to not in targets:
        raise UsageError(
            f"--task {task} writes "
            + (f"--to {' or '.join(targets)}" if targets else "no target yet")
            + f", not {to}",
            path=path,
        )
    found = kind_of(config)
    if found != kind:
        names = ", ".join(getattr(config, "architectures", None) or [config.model_type])
        raise UnsupportedConversionError(
            f"--task {task} exports a {kind} model; this directory holds {names} "
            f"({found or 'no generation model'})",
            path=path,
            hint="tasks for it: " + ", ".join(tasks_of(config)),
        )
    return kind


def describe_task(info: Any) -> None:
    """``info``'s lines about tasks: for a Hugging Face directory the tasks it exports as (the
    default first), for a generation export the task and the cache it was written with. Read
    from JSON only (config.json, the pt2's generation.json, the ONNX inputs' names)."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from ptconvert.formats import FORMATS_BY_NAME

    path = Path(info.path)
    directory = FORMATS_BY_NAME[info.format].carries_model_spec  # a Hugging Face directory
    if directory and info.layout != "directory":  # a seq2seq export's folder
        _describe_folder(info, path)
    elif directory:
        try:
            raw = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            return
        if isinstance(raw, dict):
            config = SimpleNamespace(**{k: v for k, v in raw.items() if isinstance(k, str)})
            info.metadata["tasks"] = ", ".join(tasks_of(config))
    else:
        for target in FORMATS_BY_NAME[info.format].generation_targets():
            if target.layout == "decoder" and target.describe is not None:
                target.describe(info)


def _describe_folder(info: Any, path: Any) -> None:
    """The task and the cache of a seq2seq export's folder (``formats/hf.py`` recognises it and
    names its layout after the target that wrote it: ``seq2seq-<target>``); the task of a
    folder without its own from its config.json (Whisper's: speech)."""
    from ptconvert.generation.targets import targets

    info.metadata["task"] = folder_task(path)
    layout, _, name = info.layout.partition("-")  # seq2seq-onnx, seq2seq-pt2
    target = targets(layout).get(name)
    if target is not None and target.describe is not None:
        target.describe(info)


def folder_task(path: Any) -> str:
    """The ``-with-past`` task of a folder's config.json: speech (Whisper) or text seq2seq."""
    import json
    from types import SimpleNamespace

    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        raw = None
    config = SimpleNamespace(**raw) if isinstance(raw, dict) else SimpleNamespace()
    kind = kind_of(config) or "seq2seq"
    return next(t for t, k in GENERATION_TASKS.items() if k == kind)
