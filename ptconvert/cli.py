"""The ``ptconvert`` command: a thin click layer over the library API plus rendering.

``ptconvert SRC --to FMT [options]`` (no subcommand) is the conversion; ``info``, ``formats``,
``scan``, ``plan``, ``verify`` and ``bench`` are subcommands. ``ptconvert convert SRC …`` spells
the conversion out, so a file named like a subcommand stays reachable.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ptconvert import progress
from ptconvert.errors import EXIT_CODES, PtconvertError, UsageError, named_error

_COMMANDS = (
    "convert",
    "info",
    "formats",
    "scan",
    "plan",
    "verify",
    "bench",
    "cache",
    "completion",
)


class _ConvertByDefault(click.Group):
    """Route ``ptconvert SRC …`` to ``convert`` when SRC is not a subcommand name."""

    # the group's own options (flags): what comes after them is a command, or a conversion
    _OWN = frozenset({"--debug", "-q", "--quiet", "-v", "--verbose", "-h", "--help"})

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # the first argument that is not the group's: a command, else a conversion's SRC or
        # option (``ptconvert --model nets:make --to pt2 -o net.pt2``: code alone, no SRC)
        first = next((i for i, a in enumerate(args) if a not in self._OWN), None)
        if first is not None and args[first] not in self.commands:
            args = [*args[:first], "convert", *args[first:]]
        return super().parse_args(ctx, args)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[Any]:
        """Files (``ptconvert SRC`` converts), then the commands: click's bash script clears
        what came before a file item and lets bash list files only when nothing follows it,
        so ``ptconvert ver<TAB>`` gives ``verify``, and files where no command fits."""
        from click.shell_completion import CompletionItem

        return [CompletionItem(incomplete, type="file"), *super().shell_complete(ctx, incomplete)]


def _examples(*lines: str) -> str:
    """A command's --help epilog: its examples, kept as written (click rewraps otherwise)."""
    return "Examples:\n\n\b\n" + "\n".join(f"  {line}" for line in lines)


def _format_names(prefix: str, *extra: str) -> list[str]:
    """Completion of a format name (plugins' formats included)."""
    from ptconvert.api import format_names

    return [n for n in [*format_names(), *extra] if n.startswith(prefix)]


def _exit_code_table() -> str:
    """One line a code (click's ``\\b``: kept as written), wrapped to fit 80 columns."""
    import textwrap

    lines = ["\b"]
    for code, text in sorted(EXIT_CODES.items()):
        wrapped = textwrap.wrap(text, 73)  # click indents the epilog by 2, the code takes 5
        lines += [f"{code:>3}  {wrapped[0]}", *(f"     {line}" for line in wrapped[1:])]
    return "\n".join(lines)


@click.group(
    cls=_ConvertByDefault,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Exit codes:\n\n" + _exit_code_table(),
)
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.option(
    "-q", "--quiet", is_flag=True, help="No progress and no report: the exit code (and errors)."
)
@click.option(
    "-v", "--verbose", is_flag=True, help="Show torch's own logs and warnings while converting."
)
@click.version_option(package_name="ptconvert")
def cli(debug: bool, quiet: bool, verbose: bool) -> None:
    """Convert PyTorch models between formats, safely, and prove the result right.

    \b
      ptconvert SRC --to FMT [options]   convert (see `ptconvert convert --help`)
      ptconvert DIR --to FMT -o OUT -j N every model in a folder, N at once
      ptconvert SRC --to all -o OUT      every format reached, verified, timed
      ptconvert info PATH                describe a model file without running it
      ptconvert scan PATH                find code a pickle would run when loaded
      ptconvert formats                  list the formats ptconvert knows
      ptconvert completion bash          shell completion (eval "$(...)")

    -q and -v work anywhere on the line.
    """
    from ptconvert.plugins import load_plugins

    load_plugins()  # formats and converters of installed plugins, for every command


def _emit_json(payload: Any) -> None:
    click.echo(json.dumps(payload, indent=2, default=str))


def _show(report: Any, as_json: bool, renderer: str) -> None:
    """A command's result: its JSON under --json, else the named table of render.py."""
    if as_json:
        _emit_json(report.to_dict())
        return
    from ptconvert import render

    getattr(render, renderer)(report)


_MODEL_OPTIONS = (
    click.option("--model", help="Model spec: pkg.module:factory or file.py:factory."),
    click.option("--model-arg", multiple=True, help="k=v argument for the factory (repeatable)."),
    click.option(
        "--input",
        "inputs",
        multiple=True,
        help="Example input: NAME:SHAPE:DTYPE[:LOW:HIGH | :=VALUE] or NAME::DTYPE=VALUE.",
    ),
    click.option("--example-inputs", type=click.Path(), help="Example inputs (.safetensors/.pt)."),
    click.option("--seed", type=int, default=0, help="Seed of generated example inputs."),
    click.option(
        "--trust",
        is_flag=True,
        help="Trust the classes a pickle names (loaded by torch's restricted unpickler with "
        "exactly those allowlisted), AOTI native code, a directory's own code (auto_map).",
    ),
    click.option(
        "--allow",
        multiple=True,
        metavar="MOD.NAME",
        help="Trust this one class a pickle names (repeatable): --trust, class by class.",
    ),
    click.option(
        "--non-strict",
        is_flag=True,
        help="Leave out checkpoint keys the model does not have (reported); missing keys stay "
        "an error.",
    ),
)


def model_options(fn: Any) -> Any:
    """The options that say which model a file holds and what it is fed (one set for all)."""
    for option in reversed(_MODEL_OPTIONS):
        fn = option(fn)
    return fn


def _spec_options(options: dict[str, Any], **extra: Any) -> Any:
    """Options from the model_options values (plus command-specific fields)."""
    from pathlib import Path

    from ptconvert.model.spec import parse_model_args
    from ptconvert.options import Options

    return Options(
        model=options["model"],
        model_args=parse_model_args(options["model_arg"]),
        inputs=list(options["inputs"]),
        example_inputs=Path(options["example_inputs"]) if options["example_inputs"] else None,
        seed=options["seed"],
        trust=options["trust"],
        allow=list(options["allow"]),
        non_strict=options["non_strict"],
        **extra,
    )


_CONVERSION_OPTIONS = (
    click.option("-o", "--output", type=click.Path(), help="Output path (default: beside SRC)."),
    click.option("--force", is_flag=True, help="Replace an existing output."),
    click.option("--no-verify", is_flag=True, help="Skip the parity check after converting."),
    click.option(
        "--no-cache",
        is_flag=True,
        help="Programs: neither reuse nor fill the cache of verified artifacts (PTCONVERT_CACHE).",
    ),
    click.option("--key", help="Take the weights from this entry of a checkpoint dict."),
    click.option("--keep-prefix", is_flag=True, help="Keep a prefix shared by all keys."),
    click.option("--max-shard-size", help="Write shards of at most this size (e.g. 5GB)."),
    click.option("--metadata", multiple=True, help="k=v safetensors metadata (repeatable)."),
    click.option(
        "--dynamic-batch", is_flag=True, help="Make dimension 0 of batched inputs dynamic."
    ),
    click.option(
        "--static-sequence",
        is_flag=True,
        help="With --dynamic-batch: keep a Hugging Face model's other axes (text and decoder "
        "sequence, waveform samples, image height/width) at the example's sizes (by default "
        "they are dynamic, up to the config's limits).",
    ),
    click.option("--dynamic", multiple=True, help="NAME:AXIS[:MIN:MAX] dynamic dimension."),
    click.option(
        "--method",
        type=click.Choice(["auto", "script", "trace"]),
        default="auto",
        help="TorchScript: script, trace, or auto (script, falling back to trace).",
    ),
    click.option(
        "--export-mode",
        type=click.Choice(["auto", "strict", "non-strict"]),
        default="auto",
        help="torch.export: auto tries non-strict, then strict.",
    ),
    click.option(
        "--task",
        help="A Hugging Face directory: the transformers class to load (e.g. AutoModel), or an "
        "optimum task: text-generation-with-past exports a causal LM with its KV cache (pt2: a "
        "static cache; onnx: past_key_values inputs), checked by generating; text-generation, "
        "feature-extraction, … (the graph without a cache).",
    ),
    click.option(
        "--cache-length",
        type=int,
        help="--task …-with-past --to pt2: the static cache's positions (default: the config's, "
        "at most 1024).",
    ),
    click.option(
        "--device",
        type=click.Choice(["cpu", "cuda"]),
        default="cpu",
        help="Where the result runs: --to aoti compiles for it, --bench times there, and AOTI "
        "and ONNX results are checked there (eager runs on the CPU).",
    ),
    click.option(
        "--aoti-option",
        "aoti_options",
        multiple=True,
        help="k=v Inductor config for --to aoti (e.g. max_autotune=true; repeatable).",
    ),
    click.option("--opset", type=int, help="--to onnx: the ai.onnx opset (default: torch's)."),
    click.option(
        "--external-data",
        is_flag=True,
        help="--to onnx: weights in NAME.onnx.data beside the model (always over 2 GB).",
    ),
    click.option(
        "--onnx-optimize", is_flag=True, help="--to onnx: run onnxscript's graph optimizer."
    ),
    click.option(
        "--keep-debug-info",
        is_flag=True,
        help="pt2, aoti, onnx: keep each node's stack trace (source paths of this machine).",
    ),
    click.option(
        "--force-memory",
        is_flag=True,
        help="Convert a program although the memory estimate exceeds what is free.",
    ),
    click.option("--bench", is_flag=True, help="Time the result against eager and torch.compile."),
    click.option(
        "--skip-unsupported", is_flag=True, help="Leave out quantized/sparse/nested tensors."
    ),
    click.option(
        "--batch-sizes",
        help="Batch sizes to compare a dynamic-batch program with eager at (default 1, 2, 3, "
        "and 5, 7 when the model is fast), and with --bench to time (e.g. 1,8,32).",
    ),
)


def conversion_options(fn: Any) -> Any:
    """What a conversion can be asked for: one set for `SRC --to` and `plan` (which plans it)."""
    for option in reversed(_CONVERSION_OPTIONS):
        fn = option(fn)
    return fn


@cli.command(
    epilog=_examples(
        "ptconvert model.safetensors --to pt --force",
        "ptconvert hf-model/ --to pt2 --dynamic-batch",
        "ptconvert model.pt --to onnx --model nets:make --input x:1x3x224x224:float32",
        "ptconvert zoo/ --to safetensors -o out/ -j 4 --keep-going",
        "ptconvert model.bin --to all -o all/ --model nets:make --input x:2x8:float32",
    )
)
@click.argument("src", type=click.Path(path_type=str), required=False)
@click.option(
    "--to",
    "to",
    shell_complete=lambda ctx, param, incomplete: _format_names(incomplete, "all"),
    help="Target format (see `ptconvert formats`); `all`: every format reached, into -o DIR.",
)
@click.option(
    "--optimize",
    is_flag=True,
    help="Instead of --to: convert to pt2, aoti and onnx, verify and time each, keep the fastest.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON only.")
@click.option("-j", "--jobs", type=int, default=1, help="A folder of models: convert N at once.")
@click.option("--keep-going", is_flag=True, help="A folder of models: go on after a model fails.")
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    help="A folder of models: local processes, or Ray tasks (the `ray` extra).",
)
@click.option("--ray-address", help="--executor ray: the cluster (default: RAY_ADDRESS, or local).")
@conversion_options
@model_options
def convert(src: str | None, to: str | None, optimize: bool, as_json: bool, **options: Any) -> None:
    """Convert SRC to the format named by --to (or, with --optimize, to the fastest one).

    SRC may be a folder of models: each is converted into -o OUT_DIR at the same relative
    place (-j N at once), a summary table follows, and a re-run skips what is complete.
    Without SRC, --model's factory builds the model from code alone (its own weights)."""
    progress.set_quiet(as_json)
    from ptconvert.api import convert as run_convert
    from ptconvert.convert.batch import is_batch
    from ptconvert.convert.engine import ConversionReport

    batch = {k: options.pop(k) for k in ("jobs", "keep_going", "executor", "ray_address")}
    if src is None and (optimize or to == "all" or options["bench"]):
        raise UsageError("--optimize, --to all and --bench take a SRC (a checkpoint or folder)")
    if optimize and src is not None:
        _optimize(src, to, as_json, options)
        return
    if to is None:
        raise UsageError("say the target: --to FORMAT (see `ptconvert formats`), or --optimize")
    if to == "all" and src is not None:
        _convert_every(src, as_json, options)
        return
    if src is not None and is_batch(src):
        _convert_many(src, to, as_json, options, batch)
        return
    report = run_convert(src, to, options["output"], _options(options))
    if not isinstance(report, ConversionReport) and hasattr(report, "generation"):
        _show_generation(report, as_json)  # --task …-with-past
        return
    if isinstance(report, ConversionReport) and options["bench"] and src is not None:
        _bench_result(report, src, options)
    if as_json:
        _emit_json(report.to_dict())
    elif isinstance(report, ConversionReport):
        from ptconvert.render import render_bench, render_conversion

        render_conversion(report)
        if report.bench is not None:
            render_bench(report.bench)
    else:
        from ptconvert.render import render_weights

        render_weights(report)


def _show_generation(report: Any, as_json: bool) -> None:
    """A generation export's report: the cache it carries and the generation check."""
    if as_json:
        _emit_json(report.to_dict())
        return
    cache = report.cache
    said = (
        f"static, batch {cache['batch_size']}, {cache['length']} positions"
        if cache["kind"] == "static"
        else f"{cache['layers']} layers of {cache['past']} in, {cache['present']} out"
    )
    lines = [
        f"{report.source} → {report.output} ({report.target_format}, {report.task}, "
        f"{report.model_class}) in {report.seconds:.1f} s",
        f"  cache: {said}",
        f"  call: {report.interface.get('call') or ', '.join(report.interface['inputs'])}",
    ]
    check = report.generation
    if check is None:
        lines.append("  check: none (--no-verify)")
    else:
        lines.append(
            f"  check: generation {check.status}: greedy tokens and each step's logits "
            f"(tolerance {check.tolerance:g}) against transformers' generate"
        )
        for run in check.runs:
            lines.append(
                f"    batch {run.batch}, prompt {run.prompt_length}: {run.new_tokens} tokens "
                f"{run.status}, max abs error {run.max_abs_error:.2g}, "
                f"{run.distinct_tokens} distinct"
            )
    lines += [f"  note: {note}" for note in report.notes]
    click.echo("\n".join(lines))


def _convert_many(
    src: str, to: str, as_json: bool, options: dict[str, Any], batch: dict[str, Any]
) -> None:
    from ptconvert.api import convert_many

    if not options["output"]:
        raise UsageError(f"{src} is a folder of models: say where their outputs go with -o OUT_DIR")
    if options["bench"]:
        raise UsageError("--bench times one model: run it on one of the outputs")
    report = convert_many(src, to, options["output"], _options(options), **batch)
    _show(report, as_json, "render_batch")
    if report.exit_code:
        raise click.exceptions.Exit(report.exit_code)


def _convert_every(src: str, as_json: bool, options: dict[str, Any]) -> None:
    from ptconvert.api import convert_every

    if not options["output"]:
        raise UsageError("--to all writes one file per format: say the folder with -o OUT_DIR")
    report = convert_every(
        src,
        options["output"],
        _options(options),
        batch_sizes=_batch_sizes(options["batch_sizes"]),
    )
    _show(report, as_json, "render_every")
    if report.exit_code:
        raise click.exceptions.Exit(report.exit_code)


def _optimize(src: str, to: str | None, as_json: bool, options: dict[str, Any]) -> None:
    from ptconvert.api import optimize

    if to is not None:
        raise UsageError("--optimize chooses the target itself: leave out --to")
    report = optimize(
        src,
        options["output"],
        _options(options),
        batch_sizes=_batch_sizes(options["batch_sizes"]),
    )
    _show(report, as_json, "render_optimize")


def _options(options: dict[str, Any]) -> Any:
    return _spec_options(
        options,
        task=options["task"],
        cache_length=options["cache_length"],
        dynamic_batch=options["dynamic_batch"],
        static_sequence=options["static_sequence"],
        dynamic=list(options["dynamic"]),
        method=options["method"],
        strict=options["export_mode"],
        key=options["key"],
        keep_prefix=options["keep_prefix"],
        skip_unsupported=options["skip_unsupported"],
        verify=not options["no_verify"],
        force=options["force"],
        max_shard_size=options["max_shard_size"],
        metadata=_key_values(options["metadata"], "--metadata"),
        device=options["device"],
        aoti_options={
            k: _literal(v) for k, v in _key_values(options["aoti_options"], "--aoti-option").items()
        },
        opset=options["opset"],
        external_data=options["external_data"],
        onnx_optimize=options["onnx_optimize"],
        keep_debug_info=options["keep_debug_info"],
        force_memory=options["force_memory"],
        cache=not options["no_cache"],
        batch_sizes=_batch_sizes(options["batch_sizes"]),
    )


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


def _bench_result(report: Any, src: str, options: dict[str, Any]) -> None:
    """``--bench``: time the written program against the eager source and torch.compile."""
    from ptconvert.api import bench

    sizes = options["batch_sizes"]
    with progress.step("timing eager, torch.compile and the result"):
        report.bench = bench(
            report.output,
            _options(options),
            reference=src,
            batch_sizes=_batch_sizes(sizes),
            device=options["device"],
        )


def _batch_sizes(text: str | None) -> list[int] | None:
    """``--batch-sizes 1,8,32``: positive integers, or a usage error naming the bad part."""
    if not text:
        return None
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(f"--batch-sizes {text!r} is not comma-separated integers") from None
    if any(b < 1 for b in sizes):
        raise UsageError(f"--batch-sizes {text!r}: a batch size is 1 or more")
    return sizes


def _key_values(items: tuple[str, ...], option: str) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise UsageError(f"{option} expects key=value, got {item!r}")
        out[k] = v
    return out


@cli.command(
    epilog=_examples(
        "ptconvert info pytorch_model.bin",
        "ptconvert info model.pt2 --json",
    )
)
@click.argument("path", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def info(path: str, as_json: bool) -> None:
    """Describe a model file or directory without executing anything in it."""
    from ptconvert import describe

    progress.set_quiet(as_json)
    with progress.step(f"reading {path}"):
        result = describe(path)
    _show(result, as_json, "render_info")


@cli.command(
    epilog=_examples(
        "ptconvert formats",
        "ptconvert formats --graph mermaid",
    )
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option(
    "--graph", type=click.Choice(["table", "mermaid", "dot"]), help="Print the converter graph."
)
def formats(as_json: bool, graph: str | None) -> None:
    """List the formats ptconvert recognises, their usual suffixes and what each can hold."""
    from ptconvert.formats import FORMATS

    if graph:
        from ptconvert.convert.graph import EDGES, graph_text

        edges = [
            {"from": e.src, "to": e.dst, "step": e.step, "cost": e.cost, "needs": list(e.needs)}
            for e in EDGES
        ]
        if as_json:
            _emit_json(edges)
        elif graph == "table":
            from ptconvert.render import render_edges

            render_edges(edges)
        else:
            click.echo(graph_text(graph))
        return

    rows = [{"name": f.name, "suffixes": list(f.suffixes), "holds": f.holds} for f in FORMATS]
    if as_json:
        _emit_json(rows)
    else:
        from ptconvert.render import render_formats

        render_formats(rows)


@cli.command(
    epilog=_examples(
        "ptconvert scan model.bin",
        "ptconvert scan downloads/ -j 4 --json",
    )
)
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option("-j", "jobs", type=int, default=1, help="Scan with N processes.")
@click.option("--allow", multiple=True, help="Extend the allowlist with module.Name.")
def scan(paths: tuple[str, ...], as_json: bool, jobs: int, allow: tuple[str, ...]) -> None:
    """Scan pickle-based files for code that would run when they are loaded.

    Exit code 0 when every file is clean, 10 when any is dangerous, 3 when any cannot be read
    completely, 11 when any needs user code (or runs native code) to load.
    """
    from ptconvert.api import scan as run_scan

    progress.set_quiet(as_json)
    report = run_scan(paths, allow=allow, jobs=jobs)
    _show(report, as_json, "render_scan")
    code = {"clean": 0, "needs-code": 11, "error": 3, "dangerous": 10}[report.verdict]
    if code:
        raise click.exceptions.Exit(code)


@cli.command(
    epilog=_examples(
        "ptconvert plan model.bin --to pt2",
        "ptconvert plan hf-model/ --to aoti --dynamic-batch",
    )
)
@click.argument("src", type=click.Path(path_type=str))
@click.option("--to", "to", required=True, help="Target format.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@conversion_options
@model_options
def plan(src: str, to: str, as_json: bool, **options: Any) -> None:
    """Show the route from SRC to a format, each step, and what is missing.

    It takes every option of the conversion it plans."""
    from ptconvert.api import plan as run_plan

    result = run_plan(src, to, _options(options))
    payload = result.to_dict()
    if as_json:
        _emit_json(payload)
    elif "task" in payload:  # a generation export's plan
        click.echo(f"{src} → {to} ({payload['task']}, a {payload['kind']} model)")
        click.echo("\n".join(f"  {i}. {step}" for i, step in enumerate(payload["steps"], 1)))
    else:
        from ptconvert.render import render_plan

        render_plan(payload)
    if not result.runnable:
        raise click.exceptions.Exit(5)


@cli.command(
    epilog=_examples(
        "ptconvert verify model.bin model.pt2 --model mypkg.nets:make",
        "ptconvert verify hf-model/ model.onnx --batch-sizes 1,4",
    )
)
@click.argument("reference", type=click.Path(path_type=str))
@click.argument("candidate", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@model_options
@click.option("--batch-sizes", help="Comma-separated batch sizes (default: 1,2,3,5,7 if dynamic).")
@click.option("--atol", type=float, help="Absolute tolerance (default: by dtype).")
@click.option("--rtol", type=float, help="Relative tolerance (default: by dtype).")
@click.option("--warn-only", is_flag=True, help="Report a mismatch without failing.")
@click.option(
    "--device",
    type=click.Choice(["cpu", "cuda"]),
    default="cpu",
    help="Run the candidate here (the reference stays on the CPU).",
)
@click.option(
    "--input-map",
    multiple=True,
    help="REF=CAND: feed the reference's input REF to the candidate as CAND (repeatable).",
)
@click.option("--key", help="Take the reference's weights from this entry of a checkpoint dict.")
@click.option("--keep-prefix", is_flag=True, help="Keep a prefix shared by all weight names.")
def verify(
    reference: str,
    candidate: str,
    as_json: bool,
    batch_sizes: str | None,
    atol: float | None,
    rtol: float | None,
    warn_only: bool,
    device: str,
    input_map: tuple[str, ...],
    key: str | None,
    keep_prefix: bool,
    **options: Any,
) -> None:
    """Check that CANDIDATE computes (or holds) the same numbers as REFERENCE.

    Both are fed exactly the example inputs CANDIDATE accepts."""
    from ptconvert.api import verify as run_verify

    progress.set_quiet(as_json)
    opts = _spec_options(options, key=key, keep_prefix=keep_prefix)
    sizes = _batch_sizes(batch_sizes)
    with progress.step("verifying"):
        report = run_verify(
            reference,
            candidate,
            opts,
            batch_sizes=sizes,
            atol=atol,
            rtol=rtol,
            warn_only=warn_only,
            device=device,
            input_map=_key_values(input_map, "--input-map"),
        )
    _show(report, as_json, "render_verify")


@cli.command(
    epilog=_examples(
        "ptconvert bench model.pt2 --reference model.bin --model mypkg.nets:make",
        "ptconvert bench model.pt2 --batch-sizes 1,8,32 --plot latency.png",
        "ptconvert bench llama.pt2 --reference llama-dir --new-tokens 32",
    )
)
@click.argument("artifact", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option(
    "--reference", type=click.Path(), help="The eager source (weights + --model, HF dir)."
)
@model_options
@click.option("--batch-sizes", help="Comma-separated batch sizes to time (e.g. 1,8,32).")
@click.option(
    "--compile-mode",
    default="default",
    type=click.Choice(["default", "reduce-overhead", "max-autotune", "none"]),
)
@click.option("--repeats", type=int, default=30, help="Timed rounds (interleaved).")
@click.option("--warmup", type=int, default=5, help="Warm-up calls before timing.")
@click.option("--threads", type=int, help="torch threads for every contender.")
@click.option("--plot", "plot_path", type=click.Path(), help="Draw the latencies to a PNG.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", help="Where to run.")
@click.option(
    "--new-tokens",
    type=int,
    help="A generation export: greedy tokens generated per call (default 32).",
)
@click.option("--prompt-length", type=int, help="A generation export: prompt tokens (default 16).")
def bench(
    artifact: str,
    as_json: bool,
    reference: str | None,
    batch_sizes: str | None,
    compile_mode: str,
    repeats: int,
    warmup: int,
    threads: int | None,
    plot_path: str | None,
    device: str,
    new_tokens: int | None,
    prompt_length: int | None,
    **options: Any,
) -> None:
    """Time ARTIFACT against eager and torch.compile on the same inputs.

    A generation export (--task …-with-past: a pt2 with a static cache, an ONNX decoder with
    past inputs, a seq2seq folder) is timed generating: time to the first token and per token
    against transformers' generate on --reference (its Hugging Face directory), eager and
    torch.compile'd, at batch 1 and 8 (at most the static cache's rows)."""
    from ptconvert.api import bench as run_bench

    progress.set_quiet(as_json)
    opts = _spec_options(options)
    sizes = _batch_sizes(batch_sizes)
    with progress.step("timing eager, torch.compile and the artifact"):
        report = run_bench(
            artifact,
            opts,
            reference=reference,
            batch_sizes=sizes,
            compile_mode=compile_mode,
            repeats=repeats,
            warmup=warmup,
            threads=threads,
            device=device,
            prompt_length=prompt_length,
            new_tokens=new_tokens,
        )
    if plot_path:
        from ptconvert.verify.bench import plot

        plot(report, plot_path)
    if not as_json and hasattr(report, "text"):  # a generation export's: first token, per token
        click.echo(report.text())
        return
    _show(report, as_json, "render_bench")


@cli.command(
    epilog=_examples(
        'eval "$(ptconvert completion bash)"    # in ~/.bashrc',
        'eval "$(ptconvert completion zsh)"     # in ~/.zshrc',
        "ptconvert completion fish > ~/.config/fish/completions/ptconvert.fish",
    )
)
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the completion script of SHELL (commands, options, format names, files)."""
    from click.shell_completion import get_completion_class

    completer = get_completion_class(shell)
    assert completer is not None  # the choices are click's own shells
    click.echo(completer(cli, {}, "ptconvert", "_PTCONVERT_COMPLETE").source())


@cli.group(epilog=_examples("ptconvert cache info", "ptconvert cache clear --json"))
def cache() -> None:
    """The cache of verified programs (PTCONVERT_CACHE, else ~/.cache/ptconvert)."""


@cache.command("info")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def cache_info(as_json: bool) -> None:
    """Where the cache is, what it holds and its size."""
    from ptconvert.api import cache_info as run_info

    report = run_info()
    _show(report, as_json, "render_cache")


@cache.command("clear")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def cache_clear(as_json: bool) -> None:
    """Remove every entry (one another process is using is left, and named)."""
    from ptconvert.api import cache_clear as run_clear

    report = run_clear()
    if as_json:
        _emit_json(report.to_dict())
        return
    click.echo(
        f"freed {report.freed_bytes / 2**20:.1f} MiB: {report.removed} entries removed from "
        f"{report.root}"
    )
    for key in report.busy:
        click.echo(f"left {key[:12]}: another process is using it")


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI and turn errors into messages and documented exit codes."""
    args = list(sys.argv[1:] if argv is None else argv)
    as_json, debug = "--json" in args, "--debug" in args
    # -q/-v anywhere on the line (click would take them only before the command)
    quiet, verbose = _take(args, "-q", "--quiet"), _take(args, "-v", "--verbose")
    from ptconvert.quiet import quiet_libraries, set_verbose

    set_verbose(verbose)
    if sys.stderr.isatty() and not as_json and not quiet:
        from ptconvert.render import TerminalProgress

        progress.set_reporter(TerminalProgress())
    try:
        import contextlib
        import io

        silent = quiet and not as_json  # --json still prints its JSON
        with (
            quiet_libraries(),  # their warnings, logs and bars (-v shows them)
            contextlib.redirect_stdout(io.StringIO()) if silent else contextlib.nullcontext(),
        ):
            code = cli.main(args, prog_name="ptconvert", standalone_mode=False)
        if isinstance(code, int):  # a command's own exit code (click.exceptions.Exit)
            return code
    except PtconvertError as exc:
        if debug:
            raise
        _report_error(exc.to_dict(), str(exc), exc.exit_code, as_json)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        payload = {
            "type": "UsageError",
            "kind": "usage",
            "exit_code": 2,
            "message": exc.format_message(),
        }
        if as_json:
            _emit_json({"error": payload})
        else:
            exc.show()
        return 2
    except Exception as exc:  # a bug: say so plainly, with the traceback under --debug
        named = named_error(exc)  # unless the machine failed (no space, …) outside the API
        if named is not None and not debug:
            _report_error(named.to_dict(), str(named), named.exit_code, as_json)
            return named.exit_code
        if debug:
            raise
        message = (
            f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)"
        )
        _report_error(
            {"type": type(exc).__name__, "kind": "internal", "exit_code": 1, "message": str(exc)},
            message,
            1,
            as_json,
        )
        return 1
    return 0


def _take(args: list[str], short: str, long: str) -> bool:
    """Remove the flag ``-x``/``--long`` from ``args`` (before a ``--``), also from a group of
    short flags (``-qv``); whether it was there."""
    letter, found = short[1], False
    end = args.index("--") if "--" in args else len(args)
    for i in reversed(range(end)):
        arg = args[i]
        if arg == long:
            del args[i]
            found = True
        elif arg[:1] == "-" and arg[1:2] != "-" and letter in arg and set(arg[1:]) <= set("qv"):
            rest = arg.replace(letter, "")  # a group of the global flags only: -qv, -vq
            args[i : i + 1] = [rest] if rest != "-" else []
            found = True
    return found


def _report_error(payload: dict[str, Any], text: str, code: int, as_json: bool) -> None:
    if as_json:
        _emit_json({"error": payload})
    else:
        click.echo(f"error: {text}", err=True)


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
