"""The command line as people use it: -q/-v anywhere, examples in every --help, shell
completion, colour only on a terminal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from ptconvert import quiet
from ptconvert.cli import cli, main

PTCONVERT = [sys.executable, "-m", "ptconvert"]


def test_quiet_prints_nothing_but_errors_and_keeps_the_exit_code(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.safetensors"
    assert main([str(samples["mlp_zip"]), "--to", "safetensors", "-o", str(out), "-q"]) == 0
    assert out.exists()
    assert capsys.readouterr() == ("", "")
    assert main(["-q", str(samples["mlp_zip"]), "--to", "safetensors", "-o", str(out)]) == 8
    captured = capsys.readouterr()
    assert captured.out == "" and "already exists" in captured.err
    # --json still prints its JSON under -q
    assert main(["info", str(samples["mlp_zip"]), "--quiet", "--json"]) == 0
    assert '"format"' in capsys.readouterr().out
    # with -v in one group of flags
    assert (
        main([str(samples["mlp_zip"]), "--to", "safetensors", "-o", str(out), "--force", "-qv"])
        == 0
    )
    assert capsys.readouterr().out == ""
    assert quiet.is_verbose()
    quiet.set_verbose(False)


def test_quiet_keeps_the_errors_of_a_folder_of_models(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    (zoo / "a.pt").write_bytes(samples["mlp_zip"].read_bytes())
    (zoo / "broken.pt").write_bytes(samples["mlp_zip"].read_bytes()[:3000])
    args = [str(zoo), "--to", "safetensors", "-o", str(tmp_path / "out"), "--keep-going", "-q"]
    assert main(args) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "broken.pt" in captured.err and "cannot read this file completely" in captured.err


def test_verbose_lets_torchs_own_output_through(capfd: pytest.CaptureFixture[str]) -> None:
    try:
        assert main(["formats", "-v", "--json"]) == 0
        with quiet.quiet_torch():
            os.write(2, b"torch says\n")
        assert "torch says" in capfd.readouterr().err
        assert main(["formats", "--json"]) == 0  # without -v: silenced again
        with quiet.quiet_torch():
            os.write(2, b"torch says\n")
        assert "torch says" not in capfd.readouterr().err
    finally:
        quiet.set_verbose(False)


def test_every_command_has_examples_in_its_help() -> None:
    ctx = click.Context(cli)
    for name, command in cli.commands.items():
        text = command.get_help(click.Context(command, info_name=name, parent=ctx))
        assert "Examples:" in text and "  ptconvert " in text, name


def test_shell_completion_completes_commands_and_format_names() -> None:
    script = subprocess.run([*PTCONVERT, "completion", "bash"], capture_output=True, text=True)
    assert script.returncode == 0 and "_PTCONVERT_COMPLETE=bash_complete" in script.stdout

    def complete(words: str, index: int) -> list[tuple[str, str]]:
        env = {**os.environ, "_PTCONVERT_COMPLETE": "bash_complete"}
        env.update(COMP_WORDS=words, COMP_CWORD=str(index))
        run = subprocess.run(PTCONVERT, capture_output=True, text=True, env=env)
        return [tuple(line.split(",", 1)) for line in run.stdout.splitlines()]  # type: ignore[misc]

    # a file to convert (the shell lists the files), or a command: bash lists files only
    # when no command fits (the file item first: click's bash script clears what precedes it)
    assert complete("ptconvert sc", 1) == [("file", "sc"), ("plain", "scan")]
    assert complete("ptconvert model.bin --to p", 3) == [("plain", n) for n in ("pt", "pt2", "pte")]
    assert ("plain", "all") in complete("ptconvert model.bin --to ", 3)


def test_no_colour_when_the_output_is_not_a_terminal(samples: dict[str, Path]) -> None:
    run = subprocess.run(
        [*PTCONVERT, "info", str(samples["mlp_zip"])],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TERM")},
    )
    assert run.returncode == 0 and "fc1.weight" in run.stdout
    assert "\x1b[" not in run.stdout and "\x1b[" not in run.stderr
