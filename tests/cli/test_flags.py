"""The flags are made from the fields that declare them (options.flag()): each field is a flag,
and a command line reads back into the fields' values."""

from __future__ import annotations

import inspect
from dataclasses import fields
from typing import Any

import click
import pytest

import ptconvert
from ptconvert.cli import cli
from ptconvert.cli_flags import options_from, read_flags
from ptconvert.formats import FORMATS, target_options
from ptconvert.formats.aoti.options import AotiOptions
from ptconvert.formats.onnx.options import OnnxOptions
from ptconvert.options import BenchKeywords, Options, VerifyKeywords


def _values(command: str, line: str) -> dict[str, Any]:
    """The values click gives ``command``'s callback for the arguments ``line``."""
    group = click.Context(cli, info_name="ptconvert")
    return dict(cli.commands[command].make_context(command, line.split(), parent=group).params)


@pytest.mark.parametrize(
    ("command", "declared"),
    [("convert", Options), ("plan", Options), ("verify", VerifyKeywords), ("bench", BenchKeywords)],
)
def test_every_field_is_a_flag_of_its_commands(command: str, declared: type) -> None:
    """A conversion's commands have the targets' own options too (``Format.options_class``:
    ``--opset`` …), read into ``Options.target_options``, which is no flag itself."""
    params = {p.name: p for p in cli.commands[command].params}
    declared_fields = [f for f in fields(declared) if f.name != "target_options"]
    if declared is Options:
        owners = {f.options_class for f in FORMATS if f.options_class is not None}
        assert {"opset", "pte_backend", "aoti_options"} <= set(target_options())
        declared_fields += [f for cls in owners for f in fields(cls)]
    for f in declared_fields:
        assert f.name in params, f.name
        assert list(params[f.name].opts) == [
            d for d in f.metadata["flag"]["decls"] if d.startswith("-")
        ]


def test_a_command_line_reads_into_the_options() -> None:
    values = _values(
        "convert",
        "src.pt --to pt2 --no-verify --no-cache --export-mode strict --aoti-option a=true "
        "--aoti-option b=2 --metadata k=v --batch-sizes 1,4 --model-arg n=3 --input x:2:float32 "
        "--example-inputs in.pt --dynamic-batch --allow m.C --opset 18",
    )
    opts = options_from(values)
    assert (opts.verify, opts.cache, opts.strict, opts.dynamic_batch) == (
        False,
        False,
        "strict",
        True,
    )
    assert opts.of(AotiOptions).aoti_options == {"a": True, "b": 2}
    assert opts.of(OnnxOptions) == OnnxOptions(opset=18) and opts.metadata == {"k": "v"}
    assert opts.batch_sizes == [1, 4] and opts.model_args == {"n": 3}
    assert (opts.inputs, opts.allow, str(opts.example_inputs)) == (
        ["x:2:float32"],
        ["m.C"],
        "in.pt",
    )
    assert options_from(_values("convert", "src.pt")) == Options()


def test_verify_and_bench_read_their_own_keywords() -> None:
    values = _values("verify", "a b --atol 0.1 --input-map x=y --warn-only")
    own = read_flags(VerifyKeywords, {f.name: values[f.name] for f in fields(VerifyKeywords)})
    assert own == {
        "batch_sizes": None,
        "atol": 0.1,
        "rtol": None,
        "warn_only": True,
        "device": "cpu",
        "input_map": {"x": "y"},
    }
    values = _values("bench", "a --reference r --repeats 3")
    own = read_flags(BenchKeywords, {f.name: values[f.name] for f in fields(BenchKeywords)})
    assert (own["reference"], own["repeats"], own["warmup"], own["compile_mode"]) == (
        "r",
        3,
        5,
        "default",
    )


def test_the_api_shows_the_keywords_declared() -> None:
    for function, declared in (
        (ptconvert.verify, VerifyKeywords),
        (ptconvert.bench, BenchKeywords),
    ):
        params = inspect.signature(function).parameters
        for f in fields(declared):
            assert params[f.name].kind is inspect.Parameter.KEYWORD_ONLY
            assert params[f.name].default == f.default
