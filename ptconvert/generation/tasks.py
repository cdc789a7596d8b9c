"""Which generation task a model fits, and what ``plan``/``info`` say about a directory."""

from __future__ import annotations

from typing import Any

from ptconvert.errors import UnsupportedConversionError, UsageError
from ptconvert.options import GENERATION_TASKS

# the targets each generation task writes so far
TARGETS: dict[str, tuple[str, ...]] = {
    "decoder": ("pt2", "onnx", "aoti", "pte"),
    "seq2seq": ("pt2", "onnx"),  # a folder: the encoder, the decoder, the configs
    "speech-seq2seq": ("pt2", "onnx"),  # Whisper: a folder as seq2seq's
}
FOLDER_KINDS = ("seq2seq", "speech-seq2seq")  # an encoder and a decoder: written as a folder


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


def check_task(task: str, to: str, config: Any, path: Any) -> str:
    """The kind of model ``task`` exports, after checking that the directory holds one and that
    ``to`` is a target the task writes; a named error otherwise."""
    kind = GENERATION_TASKS[task]
    targets = TARGETS[kind]
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

    path = Path(info.path)
    if info.format == "hf" and info.layout != "directory":  # a seq2seq export's folder
        _describe_folder(info, path)
    elif info.format == "hf":
        try:
            raw = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            return
        if isinstance(raw, dict):
            config = SimpleNamespace(**{k: v for k, v in raw.items() if isinstance(k, str)})
            info.metadata["tasks"] = ", ".join(tasks_of(config))
    elif info.format in ("pt2", "aoti"):  # aoti: generation.json added by aoti_cache.py
        from ptconvert.generation.static_cache import read_meta

        meta = read_meta(path)
        if meta is not None and "task" in meta:
            info.metadata["task"] = meta["task"]
            info.metadata["cache"] = (
                f"static, batch {meta.get('batch_size')}, {meta.get('cache_length')} positions"
            )
    elif info.format == "pte":  # the constant methods an ExecuTorch LLM runner reads
        methods = info.metadata.get("constant_methods", {})
        if methods.get("use_kv_cache") and "get_max_seq_len" in methods:
            info.metadata["task"] = "text-generation-with-past"
            info.metadata["cache"] = (
                f"static, batch {methods.get('get_max_batch_size')}, "
                f"{methods['get_max_seq_len']} positions"
            )
    elif info.format == "onnx":
        names = [i.name for i in info.inputs or []]
        if any(n.startswith("past_key_values.") for n in names):
            info.metadata["task"] = "text-generation-with-past"


def _describe_folder(info: Any, path: Any) -> None:
    """The task and the cache of a seq2seq export's folder (``formats/hf.py`` recognises it):
    the decoder's ``generation.json`` (pt2), the decoders' past inputs (ONNX); the task of a
    folder without one from its config.json (Whisper's: speech)."""
    task = folder_task(path)
    if info.layout == "seq2seq-pt2":
        from ptconvert.generation.seq2seq_folder import DECODER_PT2
        from ptconvert.generation.static_cache import read_meta

        meta = read_meta(path / DECODER_PT2) or {}
        info.metadata["task"] = meta.get("task", task)
        if meta.get("cache") == "static":
            info.metadata["cache"] = (
                f"static, batch {meta.get('batch_size')}, {meta.get('cache_length')} positions "
                f"({DECODER_PT2}'s self-attention; cross-attention from the encoder's states)"
            )
    elif info.layout == "seq2seq-onnx":
        import onnx

        from ptconvert.generation.seq2seq_folder import WITH_PAST_ONNX

        info.metadata["task"] = task
        for name in (WITH_PAST_ONNX, "decoder_model_merged.onnx"):
            if (path / name).is_file():
                graph = onnx.load(str(path / name), load_external_data=False).graph
                past = [i.name for i in graph.input if i.name.startswith("past_key_values.")]
                layers = len({n.split(".")[1] for n in past})
                info.metadata["cache"] = (
                    f"{layers} layers of past_key_values.N.decoder|encoder.key|value in, "
                    f"present.N.… out ({name})"
                )
                break


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
