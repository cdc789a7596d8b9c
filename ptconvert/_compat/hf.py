"""transformers' private APIs that ptconvert calls, reads or sets: each a hook with its probe.

- ``hf_auto_model_mapping``: ``AutoModel…._model_mapping`` (formats/gguf/: the class of a config).
- ``hf_from_config``: ``PreTrainedModel._from_config`` (model/spec.py: a model built on meta).
- ``hf_keys_to_ignore``: ``model._keys_to_ignore_on_load_unexpected`` (model/spec.py).
- ``hf_attn_implementation``: ``config._attn_implementation`` (the ONNX exports' eager switch).
- ``hf_compile_all_devices``: sets ``CompileConfig._compile_all_devices`` (generation/bench.py).
- ``hf_default_logging_level``: ``transformers.utils.logging._get_default_logging_level`` (quiet).
- ``hf_static_cache_layers``: sets the ``keys``, ``values`` and ``cumulative_length`` of the
  layers of ``TorchExportableModuleWithStaticCache.static_cache`` (generation/static_cache.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ptconvert._compat.registry import TRANSFORMERS_TESTED, Hook, available, declare

_WARNING = 30  # logging.WARNING: transformers' default verbosity


def auto_model_mapping(auto: Any) -> Any:
    """The config class → model class mapping of an auto class, or None where it cannot be read."""
    if not available("hf_auto_model_mapping"):
        return None
    return auto._model_mapping


def _probe_mapping() -> bool:
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    return hasattr(_BaseAutoModelClass, "_model_mapping")


def from_config(cls: Any, config: Any) -> Any:
    """A model of class ``cls`` built from ``config`` (under ``torch.device('meta')``)."""
    if not available("hf_from_config"):
        return cls(config)
    return cls._from_config(config)


def _probe_from_config() -> bool:
    from transformers import PreTrainedModel

    return callable(getattr(PreTrainedModel, "_from_config", None))


def keys_to_ignore(model: Any) -> list[str]:
    """The patterns of unexpected checkpoint keys the model says it ignores on load."""
    if not available("hf_keys_to_ignore"):
        return []
    return list(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])


def _probe_keys() -> bool:
    from transformers import PreTrainedModel

    return hasattr(PreTrainedModel, "_keys_to_ignore_on_load_unexpected")


def attn_implementation(config: Any) -> str | None:
    """The attention implementation a model's config chose (``eager`` where it cannot say)."""
    if not available("hf_attn_implementation"):
        return "eager"
    return getattr(config, "_attn_implementation", "eager")


def _probe_attn() -> bool:
    from transformers import PretrainedConfig

    return hasattr(PretrainedConfig(), "_attn_implementation")


def compile_on_every_device(config: Any) -> bool:
    """Make a ``CompileConfig`` compile on CPU too (transformers compiles on accelerators only);
    False where this transformers has no such switch."""
    if not available("hf_compile_all_devices"):
        return False
    config._compile_all_devices = True
    return True


def _probe_compile() -> bool:
    from transformers import CompileConfig

    return hasattr(CompileConfig, "_compile_all_devices")


def default_logging_level(hf_logging: Any) -> int:
    """The verbosity transformers' logging starts at (its environment's word, else WARNING)."""
    if not available("hf_default_logging_level"):
        return _WARNING
    return int(hf_logging._get_default_logging_level())


def _probe_logging() -> bool:
    from transformers.utils import logging

    return callable(getattr(logging, "_get_default_logging_level", None))


def static_cache_pointer() -> Callable[[Any], None]:
    """The function that points the static cache's layers of transformers'
    ``TorchExportableModuleWithStaticCache`` at the wrapper's registered buffers
    (``key_cache_N``, ``value_cache_N``, ``cumulative_length_N``), as export traces them (probed
    here, once: the function itself runs inside the traced ``forward``)."""
    available("hf_static_cache_layers")
    return _point_static_cache


def _point_static_cache(inner: Any) -> None:
    for i, layer in enumerate(inner.static_cache.layers):
        layer.keys = getattr(inner, f"key_cache_{i}")
        layer.values = getattr(inner, f"value_cache_{i}")
        layer.cumulative_length = getattr(inner, f"cumulative_length_{i}")


def _probe_static() -> bool:
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    source = inspect.getsource(TorchExportableModuleWithStaticCache.__init__)
    return all(f'f"{n}_{{i}}"' in source for n in ("key_cache", "value_cache", "cumulative_length"))


for _hook in (
    Hook(
        "hf_auto_model_mapping",
        "reads transformers' AutoModel…._model_mapping (the model class of a GGUF's config)",
        "transformers",
        TRANSFORMERS_TESTED,
        _probe_mapping,
        "the auto classes are not consulted: the config's architectures name the class",
    ),
    Hook(
        "hf_from_config",
        "calls transformers' PreTrainedModel._from_config (a model built on meta)",
        "transformers",
        TRANSFORMERS_TESTED,
        _probe_from_config,
        "the class's constructor, cls(config)",
    ),
    Hook(
        "hf_keys_to_ignore",
        "reads transformers' model._keys_to_ignore_on_load_unexpected",
        "transformers",
        TRANSFORMERS_TESTED,
        _probe_keys,
        "no checkpoint key is ignored as unexpected",
    ),
    Hook(
        "hf_attn_implementation",
        "reads transformers' config._attn_implementation (ONNX exports use eager attention)",
        "transformers",
        TRANSFORMERS_TESTED,
        _probe_attn,
        "the attention is taken as eager (not switched)",
    ),
    Hook(
        "hf_compile_all_devices",
        "sets transformers' CompileConfig._compile_all_devices (bench's torch.compile on CPU)",
        "transformers",
        TRANSFORMERS_TESTED,
        _probe_compile,
        "not set: transformers compiles on accelerators only",
    ),
    Hook(
        "hf_default_logging_level",
        "calls transformers.utils.logging._get_default_logging_level (quiet restores it)",
        "transformers",
        TRANSFORMERS_TESTED,
        _probe_logging,
        "WARNING, transformers' default",
    ),
    Hook(
        "hf_static_cache_layers",
        "sets keys, values and cumulative_length of TorchExportableModuleWithStaticCache's "
        "static_cache layers (generation exports whose cache is the program's buffers)",
        "transformers",
        TRANSFORMERS_TESTED,
        _probe_static,
        None,
    ),
):
    declare(_hook)
