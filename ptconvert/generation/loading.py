"""The eager model a generation export starts from: a Hugging Face directory, scanned, loaded by
transformers from its local files (never the hub), with its cache on."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptconvert.errors import UnsupportedConversionError
from ptconvert.options import Options


@dataclass
class LoadedModel:
    model: Any
    kind: str  # decoder | seq2seq | speech-seq2seq
    notes: list[str] = field(default_factory=list)


def read_config(src: Path) -> Any:
    """The directory's config as transformers reads it (no weights loaded)."""
    from ptconvert.deps import require

    transformers = require("transformers")
    return transformers.AutoConfig.from_pretrained(
        src, local_files_only=True, trust_remote_code=False
    )


def load_model(src: Path, task: str, to: str, opts: Options) -> LoadedModel:
    """The directory's model for ``task`` (checked to fit it), in eval mode with its cache on."""
    from ptconvert.formats import detect
    from ptconvert.generation.tasks import check_task
    from ptconvert.model.spec import module_from_hf
    from ptconvert.scan.guard import guard

    if not detect(src).handler.carries_model_spec:  # a Hugging Face directory: its config
        raise UnsupportedConversionError(
            f"--task {task} exports a Hugging Face directory (config.json and weights)", path=src
        )
    kind = check_task(task, to, read_config(src), src)
    guard(src, trust=opts.trust, allow=opts.allow, remote_code=opts.trust_remote_code)
    loaded = module_from_hf(src, None, {}, trust_remote_code=opts.trust_remote_code)
    model = loaded.model
    model.config.use_cache = True
    return LoadedModel(model, kind, list(loaded.notes))


def cache_layers(cache: Any) -> list[tuple[Any, Any]]:
    """(keys, values) per layer of a transformers cache, old (``key_cache``) or new (``layers``)."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return [(k, v) for k, v in cache.to_legacy_cache()]


def cache_keyword(model: Any) -> str:
    """The keyword a model's forward takes its cache by: ``cache`` (transformers 5.2x),
    ``past_key_values`` before."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def returned_cache(outputs: Any) -> Any:
    cache = getattr(outputs, "cache", None)
    return cache if cache is not None else outputs.past_key_values
