"""The subcommands beside the conversion (cli.py): info, formats, scan, plan, verify, bench,
completion and cache, with what every command shares to print its result."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

import click

from ptconvert import progress
from ptconvert.cli_flags import conversion_options, flags, model_options, options_from, read_flags
from ptconvert.errors import (
    SUCCESS,
    InputError,
    MissingRequirementError,
    NeedsTrustError,
    UnsafeInputError,
)
from ptconvert.options import BenchKeywords, Options, VerifyKeywords

# --revision and --cache-dir, for the commands that take no other Options (info, scan)
hub_options = flags(Options, names=("revision", "cache_dir"))


def examples(*lines: str) -> str:
    """A command's --help epilog: its examples, kept as written (click rewraps otherwise)."""
    return "Examples:\n\n\b\n" + "\n".join(f"  {line}" for line in lines)


def emit_json(payload: Any) -> None:
    click.echo(json.dumps(payload, indent=2, default=str))


def show(report: Any, as_json: bool, renderer: str) -> None:
    """A command's result: its JSON under --json, else the named table of render.py."""
    if as_json:
        emit_json(report.to_dict())
        return
    from ptconvert import render

    getattr(render, renderer)(report)


@click.command(
    epilog=examples(
        "ptconvert info pytorch_model.bin",
        "ptconvert info model.pt2 --json",
        "ptconvert info acme/tiny-gpt2 --revision v1",
    )
)
@click.argument("path", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@hub_options
def info(path: str, as_json: bool, **hub: Any) -> None:
    """Describe a model file or directory (or a Hugging Face Hub id's snapshot in the Hub
    cache) without executing anything in it."""
    from ptconvert import describe

    progress.set_quiet(as_json)
    with progress.step(f"reading {path}"):
        result = describe(path, **read_flags(Options, hub))
    show(result, as_json, "render_info")


@click.command(
    epilog=examples(
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
        from ptconvert.convert.graph import edges, graph_text

        rows = [
            {"from": e.src, "to": e.dst, "step": e.step, "cost": e.cost, "needs": list(e.needs)}
            for e in edges()
        ]
        if as_json:
            emit_json(rows)
        elif graph == "table":
            from ptconvert.render import render_edges

            render_edges(rows)
        else:
            click.echo(graph_text(graph))
        return

    rows = [{"name": f.name, "suffixes": list(f.suffixes), "holds": f.holds} for f in FORMATS]
    if as_json:
        emit_json(rows)
    else:
        from ptconvert.render import render_formats

        render_formats(rows)


@click.command(
    epilog=examples(
        "ptconvert scan model.bin",
        "ptconvert scan downloads/ -j 4 --json",
        "ptconvert scan . --exclude 'logs/*' --format sarif > scan.sarif",
        "ptconvert scan acme/tiny-gpt2 --cache-dir /data/hf-cache",
    )
)
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print JSON only (--format json).")
@click.option(
    "--format",
    "output",
    type=click.Choice(["table", "json", "sarif"]),
    default="table",
    help="table; json; sarif: SARIF 2.1.0 for CI code scanning.",
)
@click.option("-j", "jobs", type=int, default=1, help="Scan with N processes.")
@click.option("--allow", multiple=True, help="Extend the allowlist with module.Name.")
@click.option(
    "--include", multiple=True, help="Scan only a folder's files matching this glob (repeatable)."
)
@click.option("--exclude", multiple=True, help="Skip a folder's files matching this glob.")
@hub_options
def scan(
    paths: tuple[str, ...],
    as_json: bool,
    output: str,
    jobs: int,
    allow: tuple[str, ...],
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    **hub: Any,
) -> None:
    """Scan the files a loader would read (pickles, archives, model formats, the code an
    auto_map imports: decided by content) for code that would run when they are loaded (a
    Hugging Face Hub id: its snapshot in the Hub cache). A glob matches a file's path below
    the folder scanned, or its name.

    Exit code 0 when every file is clean, 10 when any is dangerous, 3 when any cannot be read
    completely, 11 when any needs user code (or runs native code) to load.
    """
    from ptconvert.api import scan as run_scan

    output = "json" if as_json else output
    progress.set_quiet(output != "table")
    flags = read_flags(Options, hub)
    report = run_scan(paths, allow=allow, jobs=jobs, include=include, exclude=exclude, **flags)
    if output == "sarif":
        from ptconvert.scan.sarif import sarif

        emit_json(sarif(report))
    else:
        show(report, output == "json", "render_scan")
    code = {
        "clean": SUCCESS,
        "needs-code": NeedsTrustError.exit_code,
        "error": InputError.exit_code,
        "dangerous": UnsafeInputError.exit_code,
    }[report.verdict]
    if code:
        raise click.exceptions.Exit(code)


@click.command(
    epilog=examples(
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

    result = run_plan(src, to, options_from(options))
    payload = result.to_dict()
    if as_json:
        emit_json(payload)
    else:
        from ptconvert.render import render_plan

        render_plan(payload)
    if not result.runnable:
        raise click.exceptions.Exit(MissingRequirementError.exit_code)


@click.command(
    epilog=examples(
        "ptconvert verify model.bin model.pt2 --model mypkg.nets:make",
        "ptconvert verify hf-model/ model.onnx --batch-sizes 1,4",
    )
)
@click.argument("reference", type=click.Path(path_type=str))
@click.argument("candidate", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@model_options
@flags(VerifyKeywords)
@flags(
    Options,
    names=("key", "keep_prefix"),
    help={
        "key": "Take the reference's weights from this entry of a checkpoint dict.",
        "keep_prefix": "Keep a prefix shared by all weight names.",
    },
)
def verify(reference: str, candidate: str, as_json: bool, **values: Any) -> None:
    """Check that CANDIDATE computes (or holds) the same numbers as REFERENCE.

    Both are fed exactly the example inputs CANDIDATE accepts."""
    from ptconvert.api import verify as run_verify

    progress.set_quiet(as_json)
    own = {f.name: values.pop(f.name) for f in fields(VerifyKeywords)}
    opts = options_from(values)
    keywords = read_flags(VerifyKeywords, own)
    with progress.step("verifying"):
        report = run_verify(reference, candidate, opts, **keywords)
    show(report, as_json, "render_verify")


@click.command(
    epilog=examples(
        "ptconvert bench model.pt2 --reference model.bin --model mypkg.nets:make",
        "ptconvert bench model.pt2 --batch-sizes 1,8,32 --plot latency.png",
        "ptconvert bench llama.pt2 --reference llama-dir --new-tokens 32",
    )
)
@click.argument("artifact", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@flags(BenchKeywords, "source")
@model_options
@flags(
    BenchKeywords,
    before={
        "device": [
            click.option(
                "--plot", "plot_path", type=click.Path(), help="Draw the latencies to a PNG."
            )
        ]
    },
)
def bench(artifact: str, as_json: bool, plot_path: str | None, **values: Any) -> None:
    """Time ARTIFACT against eager and torch.compile on the same inputs.

    A generation export (--task …-with-past: a pt2 with a static cache, an ONNX decoder with
    past inputs, a seq2seq folder) is timed generating: time to the first token and per token
    against transformers' generate on --reference (its Hugging Face directory), eager and
    torch.compile'd, at batch 1 and 8 (at most the static cache's rows)."""
    from ptconvert.api import bench as run_bench

    progress.set_quiet(as_json)
    own = {f.name: values.pop(f.name) for f in fields(BenchKeywords)}
    opts = options_from(values)
    keywords = read_flags(BenchKeywords, own)
    with progress.step("timing eager, torch.compile and the artifact"):
        report = run_bench(artifact, opts, **keywords)
    if plot_path:
        from ptconvert.verify.bench import plot

        plot(report, plot_path)
    if not as_json and hasattr(report, "text"):  # a generation export's: first token, per token
        click.echo(report.text())
        return
    show(report, as_json, "render_bench")


@click.command(
    epilog=examples(
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
    root = click.get_current_context().find_root().command
    click.echo(completer(root, {}, "ptconvert", "_PTCONVERT_COMPLETE").source())


@click.group(epilog=examples("ptconvert cache info", "ptconvert cache clear --json"))
def cache() -> None:
    """The cache of verified programs (PTCONVERT_CACHE, else ~/.cache/ptconvert)."""


@cache.command("info")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def cache_info(as_json: bool) -> None:
    """Where the cache is, what it holds and its size."""
    from ptconvert.api import cache_info as run_info

    report = run_info()
    show(report, as_json, "render_cache")


@cache.command("clear")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def cache_clear(as_json: bool) -> None:
    """Remove every entry (one another process is using is left, and named)."""
    from ptconvert.api import cache_clear as run_clear

    report = run_clear()
    if as_json:
        emit_json(report.to_dict())
        return
    click.echo(
        f"freed {report.freed_bytes / 2**20:.1f} MiB: {report.removed} entries removed from "
        f"{report.root}"
    )
    for key in report.busy:
        click.echo(f"left {key[:12]}: another process is using it")


COMMANDS = (info, formats, scan, plan, verify, bench, completion, cache)
