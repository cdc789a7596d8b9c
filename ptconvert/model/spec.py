"""Getting an ``nn.Module`` from weights: a model spec says which module the weights belong to.

- a Hugging Face directory: the transformers class named in ``config.json`` ``architectures``,
  built from the config (random init, no hub access) and loaded strictly;
- ``--model pkg.module:factory`` or ``--model path/to/file.py:factory`` (with ``--model-arg k=v``);
  the factory's module may define ``example_inputs(batch_size)`` returning a dict of tensors;
- a whole-module pickle, only with ``--trust`` after the scanner reported needs-code at most.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ptconvert import _compat
from ptconvert.errors import (
    MissingRequirementError,
    ModelDefinitionError,
    ModelRaisedError,
    NeedsTrustError,
    UsageError,
)
from ptconvert.model.inputs import ExampleInputs
from ptconvert.options import GENERATION_TASKS, TASK_CLASSES


@dataclass
class ModelSpec:
    factory: str  # "pkg.module:factory" or "path/file.py:factory"
    args: dict[str, Any]


def parse_model_args(items: tuple[str, ...] | list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--model-arg expects key=value, got {item!r}")
        try:
            out[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            out[key] = raw
    return out


def _import_factory(spec: str) -> tuple[Callable[..., Any], Any]:
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise UsageError(f"--model {spec!r} is not pkg.module:factory or file.py:factory")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise UsageError("model file not found", path=path)
        mod_name = f"_ptconvert_model_{abs(hash(path.resolve()))}"
        loader = importlib.util.spec_from_file_location(mod_name, path)
        assert loader is not None and loader.loader is not None
        module = importlib.util.module_from_spec(loader)
        sys.modules[mod_name] = module
        loader.loader.exec_module(module)
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))  # as `python -m` does: the current directory
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise MissingRequirementError(
                f"cannot import the model module {target!r} ({exc})",
                hint="make it importable (PYTHONPATH) or pass --model path/to/file.py:factory",
            ) from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise UsageError(f"{target} has no callable {name!r}")
    return factory, module


def module_from_factory(
    spec: ModelSpec, device: str | None = None
) -> tuple[Any, ExampleInputs | None]:
    """Call the factory (under ``torch.device(device)`` when given); also return the inputs
    its module defines, if any. The factory's module is imported as usual, never under the
    device: its module-level tensors (constants, default arguments) stay real tensors."""
    from contextlib import nullcontext

    import torch

    factory, module = _import_factory(spec.factory)
    try:
        inspect.signature(factory).bind(**spec.args)
    except TypeError as exc:
        raise UsageError(
            f"--model-arg does not fit {spec.factory}: {exc}",
            hint=f"it takes {inspect.signature(factory)}",
        ) from None
    except ValueError:  # no signature to check (a builtin): the call says
        pass
    try:
        with torch.device(device) if device else nullcontext():
            model = factory(**spec.args)
    except Exception as exc:  # the user's factory, with the user's --model-arg values
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ModelRaisedError(
            f"the model factory {spec.factory} raised {type(exc).__name__}: {first}",
            hint=f"check --model-arg against {spec.factory}'s parameters",
        ) from None
    if not isinstance(model, torch.nn.Module):
        if not callable(model):
            raise UsageError(f"{spec.factory} returned a {type(model).__name__}, not a model")
        from ptconvert.model.wrappers import callable_module

        model = callable_module(model)  # e.g. a predictor's bound method: wrapped as a module
    inputs = None
    make = getattr(module, "example_inputs", None)
    if callable(make):
        where = f"{spec.factory.rsplit(':', 1)[0]}:example_inputs"
        inputs = ExampleInputs(
            lambda b: named_example(make(b), model, where), 2, f"{spec.factory} example_inputs"
        )
    return model.eval(), inputs


def named_example(value: Any, model: Any, where: str) -> dict[str, Any]:
    """What a module's ``example_inputs(batch_size)`` returned, by forward's names: a dict as
    it is; a tuple or list (torch.export's habit: positional) or a lone tensor named after
    forward's leading parameters. Anything else is a UsageError that names types and shapes,
    never a tensor's values."""
    if isinstance(value, dict):
        return dict(value)
    items = list(value) if isinstance(value, tuple | list) else [value]
    forward = getattr(model, "forward", model)
    try:
        params = [
            p.name
            for p in inspect.signature(forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
        ]
    except (TypeError, ValueError):
        params = []
    if not hasattr(value, "shape") and not isinstance(value, tuple | list):
        raise UsageError(
            f"{where} returned a {type(value).__name__}: expected a dict of named inputs, or a "
            "tuple of positional ones"
        )
    if len(items) > len(params):
        shown = ", ".join(_shape_of(v) for v in items)
        raise UsageError(
            f"{where} returned {len(items)} positional inputs ({shown}) and forward takes "
            f"{len(params)} ({', '.join(params) or 'none by position'})",
            hint="return a dict of forward's parameter names to inputs",
        )
    return dict(zip(params, items, strict=False))


def _shape_of(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is None:
        return type(value).__name__
    return f"{str(getattr(value, 'dtype', '')).removeprefix('torch.')}{list(shape)}"


@dataclass
class HfModel:
    model: Any
    notes: list[str]


@contextmanager
def _no_progress_bar(transformers: Any) -> Iterator[None]:
    """transformers' own "Loading weights" bar off while it loads, as it was after."""
    hf_logging = transformers.utils.logging
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def module_from_hf(
    directory: Path,
    task: str | None,
    shapes: dict[str, tuple[int, ...]],
    *,
    trust_remote_code: bool = False,
) -> HfModel:
    """The transformers model of ``config.json``, loaded by transformers itself from the local
    directory (its key renames and weight tying apply; never the hub).

    The class: ``--task``, else ``architectures``, else the auto class of the config's model type
    whose parameters the file's tensors cover. As transformers does, keys the class ignores by
    design are silent, other unexpected keys are reported; missing keys (weights that would be
    random) are an error.

    A directory whose ``auto_map`` names its own code (``modeling_x.py``) loads only with
    ``trust_remote_code``: transformers imports that code, which runs."""
    from ptconvert.deps import require
    from ptconvert.formats.hf import read_config, remote_code

    transformers = require("transformers")
    code = remote_code(read_config(directory))
    if code and not trust_remote_code:
        raise NeedsTrustError(
            "the directory's own code runs when transformers loads it (auto_map: "
            + ", ".join(code)
            + ")",
            path=directory,
            hint="pass --trust-remote-code if you trust its source (--trust does not run a "
            "folder's code)",
        )
    remote = {"trust_remote_code": bool(code)}
    config = _auto_config(transformers, directory, remote)
    names = list(getattr(config, "architectures", None) or [])
    notes: list[str] = []
    if code:
        notes.append(
            f"--trust-remote-code: the directory's own code ran (auto_map: {', '.join(code)})"
        )
    if task:
        cls = getattr(transformers, _task_class(task), None)
        if cls is None:
            raise UsageError(
                f"--task {task!r} is not a transformers Auto class or model class, nor a task "
                "ptconvert knows",
                hint="tasks: " + ", ".join(sorted(TASK_CLASSES)),
            )
    elif names and hasattr(transformers, names[0]):
        cls = getattr(transformers, names[0])
    elif code:
        cls = getattr(transformers, _auto_class(config, names), None)
        if cls is None:
            raise UsageError(
                "auto_map names no transformers Auto class for the model",
                path=directory,
                hint="pass --task with the Auto class to load it with",
            )
    else:
        cls = _class_from_keys(transformers, config, shapes)
        notes.append(
            f"config.json names no architectures: chose {cls.__name__}, the class for model type "
            f"{config.model_type!r} whose parameters the weights cover (--task overrides)"
        )
    with _no_progress_bar(transformers):  # ptconvert's own progress names the step
        try:
            model, info = cls.from_pretrained(
                directory, local_files_only=True, output_loading_info=True, **remote
            )
        except RuntimeError as exc:  # transformers refuses weights of other shapes
            raise _misfit(cls, config, shapes, directory, exc) from None
        except Exception as exc:  # a weights file torch's safe loader refuses, remote code
            # that does not build (no post_init) …: said, never an internal error
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            raise ModelDefinitionError(
                f"transformers cannot load {cls.__name__} from this directory: "
                f"{type(exc).__name__}: {first}",
                path=directory,
            ) from None
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "mismatched_keys") and v}
    if bad:
        raise ModelDefinitionError(
            f"the weights do not fit {type(model).__name__}: "
            + "; ".join(
                f"{k.replace('_', ' ')} {sorted(map(str, v))[:10]}" for k, v in bad.items()
            ),
            path=directory,
            hint="check config.json's architectures, or pass --task with the right class",
        )
    ignored = [re.compile(p) for p in _compat.hf.keys_to_ignore(model)]
    unexpected = sorted(
        k
        for k in map(str, info.get("unexpected_keys") or ())
        if not any(p.search(k) for p in ignored)
    )
    if unexpected:
        notes.append(
            f"{len(unexpected)} weight(s) in the file are not used by {type(model).__name__} "
            f"and were left out, as transformers does: {unexpected[:10]}"
        )
    return HfModel(model.eval(), notes)


def _task_class(task: str) -> str:
    """``--task``: an optimum task name as the Auto class that loads it; a class name as it is.
    A generation task (``text-generation-with-past``) exports through ptconvert/generation/,
    for the targets it names; anywhere else it is a usage error."""
    if task in GENERATION_TASKS:
        raise UsageError(
            f"--task {task} is a generation export: `ptconvert SRC --to pt2|onnx --task {task}` "
            "writes it (not --to all, --optimize or verify)"
        )
    return TASK_CLASSES.get(task, task)


def _auto_config(transformers: Any, directory: Path, remote: dict[str, Any]) -> Any:
    """The directory's config as transformers reads it; a model type it does not know (or a
    config it cannot read) is a ModelDefinitionError naming config.json."""
    try:
        return transformers.AutoConfig.from_pretrained(directory, local_files_only=True, **remote)
    except (ValueError, KeyError, TypeError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ModelDefinitionError(
            f"transformers {transformers.__version__} cannot read this config: {first}",
            path=directory / "config.json",
            hint="check model_type in config.json, or upgrade transformers; --model "
            "pkg.module:factory loads the weights into a model of your own",
        ) from None


def _misfit(
    cls: Any, config: Any, shapes: dict[str, tuple[int, ...]], directory: Path, exc: Exception
) -> ModelDefinitionError:
    """transformers' refusal to load the weights, as the tensors whose shapes differ from the
    model's (built on meta to compare) or, when the names do not tell, in its own words."""
    import torch

    try:
        with torch.device("meta"):
            model = _compat.hf.from_config(cls, config)
        own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        prefix = getattr(model, "base_model_prefix", "") + "."
        _refuse_shapes(own, _with_prefix(shapes, prefix, set(own)), directory)
    except ModelDefinitionError as named:
        return named
    except Exception:  # a class that does not build from this config: nothing to compare
        pass
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return ModelDefinitionError(
        f"transformers cannot load the weights into {cls.__name__}: {first}",
        path=directory,
        hint="check config.json's architectures and sizes, or pass --task with the right class",
    )


def _refuse_shapes(
    own: dict[str, tuple[int, ...]], shapes: dict[str, tuple[int, ...]], where: Path
) -> None:
    """A ModelDefinitionError listing each tensor whose shape in the weights (``shapes``)
    differs from the model's (``own``), when there is one."""
    wrong = {k: (s, own[k]) for k, s in shapes.items() if k in own and tuple(s) != own[k]}
    if not wrong:
        return
    listed = "; ".join(
        f"{k}: {list(got)} in the weights, {list(want)} in the model"
        for k, (got, want) in list(wrong.items())[:10]
    )
    more = f" (and {len(wrong) - 10} more)" if len(wrong) > 10 else ""
    raise ModelDefinitionError(
        f"{len(wrong)} tensor(s) have another shape than the model's: {listed}{more}",
        path=where,
        hint="the weights belong to another configuration: check config.json or --model "
        "and --model-arg",
    )


def _auto_class(config: Any, architectures: list[str]) -> str:
    """The Auto class of ``auto_map`` that maps to the first architecture (else AutoModel)."""
    auto_map = getattr(config, "auto_map", None) or {}
    for auto, target in auto_map.items():
        if isinstance(target, str) and architectures and target.endswith("." + architectures[0]):
            return str(auto)
    return "AutoModel" if "AutoModel" in auto_map else next(iter(auto_map), "AutoModel")


def _class_from_keys(transformers: Any, config: Any, shapes: dict[str, tuple[int, ...]]) -> Any:
    """Among the auto classes of ``config.model_type``, the one whose parameters the file's
    tensors (name → shape) cover — by name and shape (tied ones counted as their source), else,
    for keys transformers renames as it loads, by shape alone — with the fewest left over; of
    equals, the one with more parameters (a head made only of tied weights, GPT-2's lm_head)."""
    import torch
    from transformers.models.auto import modeling_auto

    names: list[str] = []
    for attr in sorted(dir(modeling_auto), key=lambda a: a != "MODEL_MAPPING_NAMES"):
        table = getattr(modeling_auto, attr)
        if (
            attr.endswith("_MAPPING_NAMES")
            and isinstance(table, dict)
            and attr != "CONFIG_MAPPING_NAMES"
        ):
            found = table.get(config.model_type)
            for name in [found] if isinstance(found, str) else list(found or ()):
                if name not in names and hasattr(transformers, name):
                    names.append(name)
    from collections import Counter

    have = set(shapes)
    best: tuple[tuple[int, int, int], Any] | None = None
    for name in names:
        cls = getattr(transformers, name)
        try:
            with torch.device("meta"):  # the parameter names without memory or init cost
                candidate = _compat.hf.from_config(cls, config)
        except Exception:  # a class may need config fields this config lacks: not a candidate
            continue
        own_shapes = {k: tuple(v.shape) for k, v in candidate.state_dict().items()}
        own = set(own_shapes)
        tied = getattr(candidate, "all_tied_weights_keys", None) or {}
        prefix = getattr(candidate, "base_model_prefix", "") + "."
        renamed = shapes if have & own else _with_prefix(shapes, prefix, own)
        file_keys = set(renamed)
        missing = {k for k in own - file_keys if tied.get(k) not in file_keys}
        wrong = {k for k in own & file_keys if renamed.get(k, own_shapes[k]) != own_shapes[k]}
        if not missing and not wrong:  # the names fit
            score = (0, len(file_keys - own), -len(own))
        else:
            # transformers renames keys as it loads (v5: attention.attention.query → q_proj):
            # then the shapes tell, every own tensor (but tied ones) matched by one in the file
            needed = Counter(s for k, s in own_shapes.items() if k not in tied)
            offered = Counter(shapes.values())
            if needed - offered:
                continue
            score = (1, sum((offered - needed).values()), -len(own))
        if best is None or score < best[0]:
            best = (score, cls)
    if best is None:
        return transformers.AutoModel  # its loading report names what is missing
    return best[1]


def _with_prefix(
    shapes: dict[str, tuple[int, ...]], prefix: str, own: set[str]
) -> dict[str, tuple[int, ...]]:
    """``shapes`` keyed as ``own`` names them: a base model's keys in a head model and back."""
    if prefix == "." or not shapes:
        return shapes
    if any(k.startswith(prefix) for k in shapes) and not any(k.startswith(prefix) for k in own):
        return {k.removeprefix(prefix): s for k, s in shapes.items()}  # a head model's file
    if any(k.startswith(prefix) for k in own):
        return {prefix + k: s for k, s in shapes.items()}
    return shapes


def load_strict(
    model: Any,
    tensors: dict[str, Any],
    where: Path,
    *,
    non_strict: bool = False,
    assign: bool = False,
) -> tuple[list[str], list[str]]:
    """Load ``tensors`` into ``model``; error on any mismatch that is not a tied weight.

    Missing keys (weights that would stay random) are always an error; keys the model does not
    have are one too unless ``non_strict`` (a training checkpoint's extra entries). Returns the
    keys restored from the weight they are tied to, and the unexpected keys left out. With
    ``assign`` the module takes the tensors themselves (a model built on the meta device)."""
    own = model.state_dict()
    tensors = _match_base_prefix(model, own, tensors)
    from torch.nn.parameter import is_lazy

    # a lazy module's parameters have no shape yet: loading gives them the checkpoint's
    known = {k: tuple(v.shape) for k, v in own.items() if not is_lazy(v)}
    _refuse_shapes(known, _shapes(tensors), where)
    result = model.load_state_dict(tensors, strict=False, assign=assign)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    loaded_ptrs = {own[k].data_ptr() for k in tensors if k in own}
    tied = [k for k in result.missing_keys if model.state_dict()[k].data_ptr() in loaded_ptrs]
    missing = [k for k in result.missing_keys if k not in tied]
    unexpected = list(result.unexpected_keys)
    if missing or (unexpected and not non_strict):
        raise ModelDefinitionError(
            "the weights do not fit the model: "
            + (f"missing {missing[:10]}" if missing else "")
            + ("; " if missing and unexpected else "")
            + (f"unexpected {unexpected[:10]}" if unexpected else ""),
            path=where,
            hint="check --model / config.json, or --key and --keep-prefix for the checkpoint"
            + ("" if missing else "; --non-strict leaves out keys the model does not have"),
        )
    return tied, unexpected


def _shapes(tensors: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in tensors.items() if hasattr(v, "shape")}


def choose_target(model: Any, keys: list[str]) -> tuple[str, Any]:
    """The object among ``load_targets(model)`` whose state dict ``keys`` fit best: fewest of its
    own keys left missing, then fewest keys left over; the model itself on a tie."""
    from ptconvert.model.wrappers import load_targets

    targets = load_targets(model)
    have = set(keys)

    def misfit(target: Any) -> tuple[int, int]:
        own = target.state_dict()
        names = set(_match_base_prefix(target, own, dict.fromkeys(have)))
        return len(set(own) - names), len(names - set(own))

    return min(targets, key=lambda t: misfit(t[1]))


def _match_base_prefix(model: Any, own: dict[str, Any], tensors: dict[str, Any]) -> dict[str, Any]:
    """transformers checkpoints of a head model load into the base model and back: add or strip
    the ``base_model_prefix`` (``transformer.``, ``bert.``) as from_pretrained does."""
    prefix = getattr(model, "base_model_prefix", "")
    if not prefix or set(tensors) & set(own):
        return tensors
    dotted = prefix + "."
    if all(k.startswith(dotted) for k in tensors):
        return {k[len(dotted) :]: v for k, v in tensors.items()}
    if any(k.startswith(dotted) for k in own):
        return {dotted + k: v for k, v in tensors.items()}
    return tensors
