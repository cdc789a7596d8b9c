"""The ``ptconvert`` command: a thin click layer over the library API plus rendering.

``ptconvert SRC --to FMT [options]`` (no subcommand) is the conversion, here with the group and
the errors turned into exit codes; ``info``, ``formats``, ``scan``, ``plan``, ``verify``,
``bench``, ``cache`` and ``completion`` are subcommands (cli_commands.py), and the flags come
from the fields that declare them (cli_flags.py). ``ptconvert convert SRC …`` spells the
conversion out, so a file named like a subcommand stays reachable.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from ptconvert import __version__, progress
from ptconvert.cli_commands import COMMANDS, emit_json, examples, show
from ptconvert.cli_flags import batch_sizes, conversion_options, model_options, options_from
from ptconvert.errors import (
    EXIT_CODES,
    SUCCESS,
    InternalError,
    Interrupted,
    PtconvertError,
    UsageError,
    named_error,
)


class _ConvertByDefault(click.Group):
    """Route ``ptconvert SRC …`` to ``convert`` when SRC is not a subcommand name."""

    # the group's own options (flags): what comes after them is a command, or a conversion
    _OWN = frozenset({"--debug", "-q", "--quiet", "-v", "--verbose", "-h", "--help", "--version"})

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
@click.version_option(version=__version__, prog_name="ptconvert")
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

    --debug, -q and -v work anywhere on the line.
    """
    from ptconvert.plugins import load_plugins

    load_plugins()  # formats and converters of installed plugins, for every command


@cli.command(
    epilog=examples(
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
    from ptconvert.convert.batch_discovery import is_batch

    batch = {k: options.pop(k) for k in ("jobs", "keep_going", "executor", "ray_address")}
    every = to is not None and to.strip().lower() == "all"
    if src is None and (optimize or every or options["bench"]):
        raise UsageError("--optimize, --to all and --bench take a SRC (a checkpoint or folder)")
    if optimize and src is not None:
        _optimize(src, to, as_json, options)
        return
    if to is None:
        raise UsageError("say the target: --to FORMAT (see `ptconvert formats`), or --optimize")
    if every and src is not None:
        _convert_every(src, as_json, options)
        return
    if src is not None and is_batch(src):
        _convert_many(src, to, as_json, options, batch)
        return
    report = run_convert(src, to, options["output"], options_from(options))
    if options["bench"] and src is not None and report.weights is None and not report.generation:
        _bench_result(report, src, options)
    if as_json:
        emit_json(report.to_dict())
        return
    from ptconvert.render import render_bench, render_conversion

    render_conversion(report)
    if report.bench is not None:
        render_bench(report.bench)


for _command in COMMANDS:  # the subcommands, after the conversion
    cli.add_command(_command)


def _convert_many(
    src: str, to: str, as_json: bool, options: dict[str, Any], batch: dict[str, Any]
) -> None:
    from ptconvert.api import convert_many

    if not options["output"]:
        raise UsageError(f"{src} is a folder of models: say where their outputs go with -o OUT_DIR")
    if options["bench"]:
        raise UsageError("--bench times one model: run it on one of the outputs")
    report = convert_many(src, to, options["output"], options_from(options), **batch)
    show(report, as_json, "render_batch")
    if report.exit_code:
        raise click.exceptions.Exit(report.exit_code)


def _convert_every(src: str, as_json: bool, options: dict[str, Any]) -> None:
    from ptconvert.api import convert_every

    if not options["output"]:
        raise UsageError("--to all writes one file per format: say the folder with -o OUT_DIR")
    report = convert_every(
        src,
        options["output"],
        options_from(options),
        batch_sizes=batch_sizes(options["batch_sizes"]),
    )
    show(report, as_json, "render_every")
    if report.exit_code:
        raise click.exceptions.Exit(report.exit_code)


def _optimize(src: str, to: str | None, as_json: bool, options: dict[str, Any]) -> None:
    from ptconvert.api import optimize

    if to is not None:
        raise UsageError("--optimize chooses the target itself: leave out --to")
    report = optimize(
        src,
        options["output"],
        options_from(options),
        batch_sizes=batch_sizes(options["batch_sizes"]),
    )
    show(report, as_json, "render_optimize")


def _bench_result(report: Any, src: str, options: dict[str, Any]) -> None:
    """``--bench``: time the written program against the eager source and torch.compile."""
    from ptconvert.api import bench

    sizes = options["batch_sizes"]
    with progress.step("timing eager, torch.compile and the result"):
        report.bench = bench(
            report.output,
            options_from(options),
            reference=src,
            batch_sizes=batch_sizes(sizes),
            device=options["device"],
        )


def _output_format(args: list[str]) -> str | None:
    """``--format X`` / ``--format=X`` (scan's table, json or sarif), or None."""
    for i, arg in enumerate(args):
        if arg == "--format" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--format="):
            return arg.partition("=")[2]
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI and turn errors into messages and documented exit codes."""
    args = list(sys.argv[1:] if argv is None else argv)
    shape = _output_format(args)
    as_json = "--json" in args or shape == "json"
    machine = as_json or shape == "sarif"  # stdout is a document: -q leaves it, no progress
    # --debug, -q and -v anywhere on the line (click would take them only before the command)
    debug = _take(args, "", "--debug")
    quiet, verbose = _take(args, "-q", "--quiet"), _take(args, "-v", "--verbose")
    from ptconvert.quiet import quiet_libraries, set_verbose

    set_verbose(verbose)
    if sys.stderr.isatty() and not machine and not quiet:
        from ptconvert.render_progress import TerminalProgress

        progress.set_reporter(TerminalProgress())
    try:
        import contextlib
        import io

        silent = quiet and not machine  # --json (or --format sarif) still prints its document
        with (
            quiet_libraries(),  # their warnings, logs and bars (-v shows them)
            contextlib.redirect_stdout(io.StringIO()) if silent else contextlib.nullcontext(),
        ):
            code = cli.main(args, prog_name="ptconvert", standalone_mode=False)
        if isinstance(code, int):  # a command's own exit code (click.exceptions.Exit)
            return code
    except PtconvertError as exc:
        _traceback(debug)
        _report_error(exc.to_dict(), str(exc), exc.exit_code, as_json)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return Interrupted.exit_code
    except click.ClickException as exc:
        payload = {
            "type": UsageError.__name__,
            "kind": UsageError.kind,
            "exit_code": UsageError.exit_code,
            "message": exc.format_message(),
        }
        if as_json:
            emit_json({"error": payload})
        else:
            exc.show()
        return UsageError.exit_code
    except Exception as exc:  # a bug: say so plainly, with the traceback under --debug
        named = named_error(exc)  # unless the machine failed (no space, …) outside the API
        _traceback(debug)
        if named is not None:
            _report_error(named.to_dict(), str(named), named.exit_code, as_json)
            return named.exit_code
        message = (
            f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)"
        )
        internal = {
            "type": type(exc).__name__,
            "kind": InternalError.kind,
            "exit_code": InternalError.exit_code,
            "message": str(exc),
        }
        _report_error(internal, message, InternalError.exit_code, as_json)
        return InternalError.exit_code
    return SUCCESS


def _traceback(debug: bool) -> None:
    """--debug: the traceback of the exception being handled, on stderr, before its message;
    the exit code stays the error's own (--debug changes only what is printed)."""
    if debug:
        import traceback

        traceback.print_exc()


def _take(args: list[str], short: str, long: str) -> bool:
    """Remove the flag ``-x``/``--long`` (``short`` may be empty) from ``args`` (before a
    ``--``), also from a group of short flags (``-qv``); whether it was there."""
    letter, found = short[1:2], False
    end = args.index("--") if "--" in args else len(args)
    for i in reversed(range(end)):
        arg = args[i]
        if arg == long:
            del args[i]
            found = True
        elif (
            letter
            and arg[:1] == "-"
            and arg[1:2] != "-"
            and letter in arg
            and set(arg[1:]) <= set("qv")
        ):
            rest = arg.replace(letter, "")  # a group of the global flags only: -qv, -vq
            args[i : i + 1] = [rest] if rest != "-" else []
            found = True
    return found


def _report_error(payload: dict[str, Any], text: str, code: int, as_json: bool) -> None:
    if as_json:
        emit_json({"error": payload})
    else:
        click.echo(f"error: {text}", err=True)


def entry() -> None:
    code = main()
    if "torch" in sys.modules:
        # torch, transformers and onnxruntime take about a second to tear down at exit; every
        # output is written, renamed into place and closed by now, and children are joined:
        # flush what is buffered and end the process here
        import logging
        import os

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
