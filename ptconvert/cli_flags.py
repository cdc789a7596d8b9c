"""The command line's flags, made from the dataclass fields that declare them
(``options.flag()``: Options, VerifyKeywords, BenchKeywords), and their text read back into
the fields' values: adding an option is adding a field."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

import click

from ptconvert.errors import UsageError
from ptconvert.options import Options, flag_of

Decorator = Callable[[Any], Any]


def flags(
    cls: type,
    group: str | None = None,
    *,
    names: Iterable[str] | None = None,
    before: dict[str, list[Decorator]] | None = None,
    help: dict[str, str] | None = None,
) -> Decorator:
    """A decorator adding the click options of ``cls``'s fields in ``group`` (or those
    ``names``), in the fields' order: ``before`` puts a command's own options before a field's,
    ``help`` says a field's help for this command."""
    chosen = [
        f
        for f in _flagged(cls)
        if (f.name in names if names is not None else flag_of(f)["group"] == group)
    ]
    options: list[Decorator] = []
    for f in chosen:
        options += (before or {}).get(f.name, [])
        is_flag = isinstance(f.default, bool)
        options.append(_option(f.name, is_flag, flag_of(f), (help or {}).get(f.name)))

    def decorate(fn: Any) -> Any:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


def _flagged(cls: type) -> list[Any]:
    """``cls``'s fields that are flags (``Options.target_options`` is filled from others')."""
    return [f for f in fields(cls) if "flag" in f.metadata]


def _option(name: str, is_bool: bool, spec: dict[str, Any], help_text: str | None) -> Decorator:
    """The click option of one field, under the field's name."""
    kwargs: dict[str, Any] = {"help": help_text or spec["help"]}
    if spec["hidden"]:
        kwargs["hidden"] = True
    if is_bool:  # a flag: given, it turns the field's default over (read_flags)
        return click.option(*spec["decls"], name, is_flag=True, **kwargs)
    if spec["choices"]:
        kwargs["type"] = click.Choice(list(spec["choices"]))
    elif spec["type"] is Path:
        kwargs["type"] = click.Path()
    elif spec["type"] is not None:
        kwargs["type"] = spec["type"]
    if spec["multiple"]:
        kwargs["multiple"] = True
    elif spec["default"] is not None:
        kwargs["default"] = spec["default"]
    if spec["metavar"]:
        kwargs["metavar"] = spec["metavar"]
    return click.option(*spec["decls"], name, **kwargs)


def read_flags(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The values of ``cls``'s fields among a command's ``values`` (those it has flags for),
    each read from its text: the conversion's before the model's (the order in which a line
    with two bad values has named the first)."""
    out: dict[str, Any] = {}
    for f in sorted(_flagged(cls), key=lambda f: flag_of(f)["group"] == "model"):
        if f.name not in values:
            continue
        value, spec = values[f.name], flag_of(f)
        if isinstance(f.default, bool):
            out[f.name] = bool(value) != f.default  # --no-verify: verify=False
        elif spec["parse"]:
            out[f.name] = PARSERS[spec["parse"]](value, spec["decls"][-1])
        elif spec["multiple"]:
            out[f.name] = list(value)
        else:
            out[f.name] = value
    return out


def options_from(values: dict[str, Any]) -> Options:
    """The Options a command's flags say (the fields it has no flag for at their defaults), the
    targets' own among them (``Format.options_class``) in ``target_options``."""
    own: dict[str, Any] = {}
    for cls in _target_option_classes():  # those given: the defaults are the class's
        defaults = cls()
        given = read_flags(cls, values).items()
        own.update({k: v for k, v in given if v != getattr(defaults, k)})
    return Options(**read_flags(Options, values), target_options=own)


def _target_option_classes() -> list[type]:
    from ptconvert.formats import target_options

    return list(dict.fromkeys(target_options().values()))


def model_options(fn: Any) -> Any:
    """The options that say which model a file holds and what it is fed (one set for all)."""
    return flags(Options, "model")(fn)


def conversion_options(fn: Any) -> Any:
    """What a conversion can be asked for: one set for `SRC --to` and `plan` (which plans it):
    the Options fields of no group, with -o and --bench (a conversion's, not an option's)."""
    output = click.option(
        "-o", "--output", type=click.Path(), help="Output path (default: beside SRC)."
    )
    bench = click.option(
        "--bench", is_flag=True, help="Time the result against eager and torch.compile."
    )
    targets = [flags(cls, names=[f.name for f in fields(cls)]) for cls in _target_option_classes()]
    for add in reversed(targets):  # shown after the shared options, in the formats' order
        fn = add(fn)
    return flags(Options, before={"force": [output], "skip_unsupported": [bench]})(fn)


# --- the text of a flag read into its field's value (options.Parse) ---------------------------


def batch_sizes(text: str | None, option: str = "--batch-sizes") -> list[int] | None:
    """``--batch-sizes 1,8,32``: positive integers, or a usage error naming the bad part."""
    if not text:
        return None
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(f"{option} {text!r} is not comma-separated integers") from None
    if any(b < 1 for b in sizes):
        raise UsageError(f"{option} {text!r}: a batch size is 1 or more")
    return sizes


def key_values(items: tuple[str, ...], option: str) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise UsageError(f"{option} expects key=value, got {item!r}")
        out[k] = v
    return out


def _literal_values(items: tuple[str, ...], option: str) -> dict[str, Any]:
    return {k: _literal(v) for k, v in key_values(items, option).items()}


def _literal(text: str) -> Any:
    """``true``/``false``, an integer or a float as such; anything else as the text."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _model_args(items: tuple[str, ...], option: str) -> dict[str, Any]:
    from ptconvert.model.spec import parse_model_args

    return parse_model_args(items)


def _path(text: str | None, option: str) -> Path | None:
    return Path(text) if text else None


PARSERS: dict[str, Callable[[Any, str], Any]] = {
    "model_args": _model_args,
    "key_values": key_values,
    "literal_values": _literal_values,
    "batch_sizes": batch_sizes,
    "path": _path,
}
