"""What the user sees (issue #29): a progress display that keeps moving while torch runs with
its output silenced, nothing but ptconvert's own output under -q and --json, and report tables
that fit the terminal without cutting a number."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from ptconvert import progress, render, render_progress
from ptconvert.quiet import quiet_libraries, quiet_torch

PTCONVERT = [sys.executable, "-m", "ptconvert"]


# --- progress that moves ------------------------------------------------------------------


def test_the_display_keeps_ticking_while_torch_is_silenced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step that blocks 2.3 s inside quiet_torch (torch.export, the AOTI compile): the display,
    on a terminal (a pty as fd 2), redraws meanwhile with the elapsed time moving, while what
    others write on fd 2 is silenced."""
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    master, slave = os.openpty()
    chunks: list[bytes] = []

    def read() -> None:  # the pty's buffer is drained as it fills
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    saved = os.dup(2)
    os.dup2(slave, 2)
    try:
        progress.set_reporter(render_progress.TerminalProgress())
        with progress.step("exported → aoti"), quiet_torch():
            os.write(2, b"torch's own chatter\n")
            time.sleep(2.3)
    finally:
        progress.set_reporter(None)
        os.dup2(saved, 2)
        os.close(saved)
        os.close(slave)
    time.sleep(0.2)
    os.close(master)
    reader.join(2)
    shown = b"".join(chunks).decode(errors="replace")
    assert "exported → aoti" in shown
    assert {"0:00:00", "0:00:01", "0:00:02"} <= set(re.findall(r"\d:\d\d:\d\d", shown)), shown
    frames = set(re.findall(r"[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏]", shown))
    assert len(frames) >= 5  # the spinner turned: redrawn by rich's thread, not the busy one
    assert "chatter" not in shown


# --- nothing but ptconvert's output ---------------------------------------------------------


@pytest.fixture(scope="module")
def bert_without_architectures(samples: dict[str, Path], tmp_path_factory: Any) -> Path:
    """The tiny BERT, its config naming no class: transformers' advice about classes the user
    never chose ("If you want to use BertLMHeadModel as a standalone …") is logged while the
    class is chosen."""
    folder = tmp_path_factory.mktemp("bert") / "bert"
    shutil.copytree(samples["hf_bert"], folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("architectures", None)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_quiet_and_json_print_nothing_that_is_not_ours(
    bert_without_architectures: Path, tmp_path: Path
) -> None:
    src = str(bert_without_architectures)
    out = tmp_path / "bert.onnx"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_")}
    run = subprocess.run(
        [*PTCONVERT, src, "--to", "onnx", "-o", str(out), "-q", "--no-cache"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    assert out.exists()
    assert (run.stdout, run.stderr) == ("", "")
    run = subprocess.run(
        [*PTCONVERT, src, "--to", "onnx", "-o", str(out), "--force", "--json", "--no-cache"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    report = json.loads(run.stdout)  # one document, nothing around it
    assert report["target_format"] == "onnx"


def test_quiet_libraries_silences_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The libraries' warnings and transformers' logs off for the run, as they were after;
    -v leaves them alone."""
    import transformers

    hf_logging = transformers.utils.logging
    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    before = hf_logging.get_verbosity()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_libraries():
            warnings.warn("deprecated", FutureWarning, stacklevel=1)
            assert hf_logging.get_verbosity() == hf_logging.ERROR
            assert os.environ["TRANSFORMERS_VERBOSITY"] == "error"  # the processes it spawns
        warnings.warn("after", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["after"]
    assert hf_logging.get_verbosity() == before
    assert "TRANSFORMERS_VERBOSITY" not in os.environ
    from ptconvert import quiet

    quiet.set_verbose(True)
    try:
        with quiet_libraries():
            assert hf_logging.get_verbosity() == before
    finally:
        quiet.set_verbose(False)


CHATTY = """
import warnings

import torch


def make():
    from transformers.utils import logging

    logging.get_logger("transformers.modeling_utils").warning("LOAD REPORT: newly initialized")
    warnings.warn("chatter from the factory", FutureWarning, stacklevel=1)
    return torch.nn.Linear(4, 2)
"""


def test_an_api_call_is_as_quiet_as_the_cli_unless_verbose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """A library call converting a model that warns and logs while it is built (transformers'
    load report, a FutureWarning) prints none of it, and leaves warnings and transformers'
    verbosity as they were; PTCONVERT_VERBOSE=1 (a library user's -v) lets them through."""
    import logging

    import transformers

    import ptconvert

    class Logged(logging.Handler):  # beside transformers' own handler, on the same logger
        def __init__(self) -> None:
            super().__init__()
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    logged = Logged()
    hf_logger = logging.getLogger("transformers")
    hf_logger.addHandler(logged)
    request.addfinalizer(lambda: hf_logger.removeHandler(logged))
    (tmp_path / "chatty.py").write_text(CHATTY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("PTCONVERT_VERBOSE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    hf_logging = transformers.utils.logging
    before = hf_logging.get_verbosity()
    spec = {"model": "chatty:make", "inputs": ["input:2x4:float32"], "verify": False}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ptconvert.convert(None, "torchscript", tmp_path / "quiet.ts", **spec)
        warnings.warn("after", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["after"]
    assert not logged.messages
    assert hf_logging.get_verbosity() == before
    monkeypatch.setenv("PTCONVERT_VERBOSE", "1")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ptconvert.convert(None, "torchscript", tmp_path / "verbose.ts", **spec)
    assert "chatter from the factory" in [str(w.message) for w in seen]
    assert any("LOAD REPORT" in m for m in logged.messages)


def test_a_factory_loading_its_own_weights_on_meta_warns_nothing(
    samples: dict[str, Path], tmp_path: Path
) -> None:
    """The meta-device build calls the factory on meta: a factory that loads weights of its
    own makes torch warn "copying … to a meta parameter is a no-op" once per tensor."""
    from ptconvert.model.build import _assigned_on_meta
    from ptconvert.model.spec import ModelSpec
    from ptconvert.options import Options
    from ptconvert.weights.read import as_tensors, read_weights

    factory = tmp_path / "own_weights.py"
    factory.write_text(
        "import torch\n"
        "from fixtures.models import MLP\n\n"
        "def make():\n"
        "    m = MLP()\n"
        "    m.load_state_dict({k: torch.zeros(v.shape, device='cpu')"
        " for k, v in m.state_dict().items()})\n"
        "    return m\n"
    )
    src = samples["mlp_zip"]
    tensors = as_tensors(read_weights(src))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _assigned_on_meta(ModelSpec(f"{factory}:make", {}), tensors, src, Options())
    assert not [w for w in seen if "meta parameter" in str(w.message)]


# --- tables that fit ------------------------------------------------------------------------


def _reports() -> dict[str, Any]:
    from ptconvert.convert.cache_store import CacheEntry, CacheInfo
    from ptconvert.convert.engine import ConversionReport
    from ptconvert.convert.optimize import Candidate, OptimizeReport
    from ptconvert.convert.state import StepRecord
    from ptconvert.verify.bench import BenchReport, Timing
    from ptconvert.verify.parity import OutputResult, ParityReport, SizeResult

    outputs = [
        OutputResult("['last_hidden_state']", "pass", 5.96e-07, 6.0123e-05, 1.08e-07, 1.1e-07),
        OutputResult("['past_key_values'][0][1]", "pass", 4.47e-08, 7.6e-05, None, 1.44e-08, 0.031),
    ]
    parity = ParityReport(
        "pass",
        [
            *(SizeResult(b, "pass", outputs) for b in (1, 2, 3)),
            SizeResult(5, "fail_shape", detail="3 outputs became 2 at this batch size"),
        ],
    )
    notes = ["exported a wrapper whose outputs are a plain dict of named tensors " * 2]
    conversion = ConversionReport(
        "/home/someone/models/tiny-bert-with-a-long-name",
        "hf",
        "/home/someone/models/tiny-bert-with-a-long-name.onnx",
        "onnx",
        ["hf → weights", "weights → module", "module → exported", "exported → onnx"],
        [
            StepRecord("read_weights", "hf → weights", 0.00123, "ok"),
            StepRecord("export", "module → exported", 12.3456, "ok", notes),
            StepRecord("onnx_export", "exported → onnx", 4.96, "ok", ["ONNX opset 20"]),
        ],
        17.3,
        parity=parity,
    )
    bench = BenchReport(
        "/home/someone/models/tiny-bert-with-a-long-name.onnx",
        2,
        "cpu",
        30,
        [
            Timing(r, b, 0.123456, 12.3456, 10.0123, 50.9876, 30)
            for b in (1, 32)
            for r in ("eager", "torch.compile", "artifact")
        ],
    )
    cache = CacheInfo(
        "/home/someone/.cache/ptconvert",
        [
            CacheEntry(
                "0123456789abcdef",
                "onnx",
                "tiny-bert-with-a-long-name",
                123456789,
                "2025-06-01T12:34:56Z",
            )
        ],
        123456789,
    )
    optimize = OptimizeReport(
        "/home/someone/models/tiny-bert-with-a-long-name",
        "out.onnx",
        "onnx",
        "cpu",
        [1, 8, 32],
        [
            Candidate("eager", "baseline", "", median_ms={1: 0.51234, 8: 1.2345, 32: 123.456}),
            Candidate(
                "onnx",
                "kept",
                "the fastest verified one",
                "parity",
                [],
                {1: 0.3, 8: 0.9, 32: 99.1},
                1.6,
            ),
            Candidate("aoti", "failed", "the C++ compiler failed: " + "long reason " * 8),
        ],
        99.9,
    )
    return {
        "render_conversion": conversion,
        "render_verify_parity": parity,
        "render_bench": bench,
        "render_cache": cache,
        "render_optimize": optimize,
    }


NUMBER_CUT = re.compile(r"\d…|…\d|e[+-]?…")


@pytest.mark.parametrize("width", [80, 120])
def test_report_tables_fit_the_terminal_without_cutting_a_number(width: int) -> None:
    for name, report in _reports().items():
        console = Console(width=width, record=True, color_system=None, file=io.StringIO())
        if name == "render_verify_parity":
            console.print(render.parity_table(report))
        else:
            getattr(render, name)(report, console)
        text = console.export_text()
        assert "…" not in text, (name, text)
        assert not NUMBER_CUT.search(text), (name, text)
        assert max(len(line) for line in text.splitlines()) <= width, (name, text)
        if name in ("render_conversion", "render_verify_parity"):
            assert "6.01e-05" in text and "1.10e-07" in text, text  # three significant digits
            assert "last_hidden_state" in text and "past_key_values.0.1" in text, text
            assert "['" not in text
        if name == "render_cache":
            assert "2025-06-01T12:34:56Z" in text
        if name == "render_bench":
            assert "10.012–50.988" in text


def test_a_conversion_says_each_note_once() -> None:
    """A step's notes are in its row of the step table; the report's other notes follow as
    ``note:`` lines (each note was printed twice: 45 lines for one ONNX conversion)."""
    import dataclasses

    report = _reports()["render_conversion"]
    step_note, own_note = "ONNX opset 20, checked with onnx.checker", "a note of the report's own"
    steps = [dataclasses.replace(report.steps[0], notes=[step_note]), *report.steps[1:]]
    report = dataclasses.replace(report, steps=steps, notes=[step_note, own_note])
    console = Console(width=120, record=True, color_system=None, file=io.StringIO())
    render.render_conversion(report, console)
    text = console.export_text()
    assert text.count(step_note) == 1 and f"note: {own_note}" in text, text


def test_a_table_too_wide_is_stacked_with_its_key_columns_again() -> None:
    parity = _reports()["render_verify_parity"]
    console = Console(width=60, record=True, color_system=None, file=io.StringIO())
    console.print(render.parity_table(parity))
    text = console.export_text()
    assert text.count("batch") >= 2 and text.count("output") >= 2  # two tables, keys in each
    assert max(len(line) for line in text.splitlines()) <= 60
    for number in ("5.96e-07", "6.01e-05", "1.08e-07", "1.10e-07", "4.47e-08", "1.44e-08"):
        assert number in text


# --- help and completion ----------------------------------------------------------------------


def test_every_help_fits_80_columns_and_the_exit_codes_are_one_a_line() -> None:
    import click

    from ptconvert.cli import cli
    from ptconvert.errors import EXIT_CODES

    def helps(command: Any, parent: Any, name: str) -> Any:
        ctx = click.Context(command, info_name=name, parent=parent, terminal_width=80)
        yield name, command.get_help(ctx)
        for sub, child in getattr(command, "commands", {}).items():
            yield from helps(child, ctx, sub)

    for name, text in helps(cli, None, "ptconvert"):
        assert max(len(line) for line in text.splitlines()) <= 80, (name, text)
    text = cli.get_help(click.Context(cli, info_name="ptconvert", terminal_width=80))
    table = text[text.index("Exit codes:") :].splitlines()[2:]
    assert "" not in table  # not double-spaced
    codes = [line.split()[0] for line in table if line[:6].strip().isdigit()]
    assert codes == [str(c) for c in sorted(EXIT_CODES)]


def test_bash_completes_a_command_before_files(tmp_path: Path) -> None:
    """click's bash script empties the list at a file item: the commands come after it."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash here")
    (tmp_path / "version.pt").write_bytes(b"")
    script = subprocess.run(
        [*PTCONVERT, "completion", "bash"], capture_output=True, text=True, check=True
    ).stdout
    test = (
        f"{script}\nCOMP_WORDS=(ptconvert ver); COMP_CWORD=1\n"
        "_ptconvert_completion ptconvert 2>/dev/null\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n"
    )
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    run = subprocess.run(
        [bash, "-c", test],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PATH": path},
    )
    assert run.stdout.split() == ["verify"], run


def test_a_piped_onnx_conversion_fits_a_screen_and_a_cached_rerun_says_so(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 44: one BERT → ONNX printed 45 lines, its notes twice, the output path scrolled
    off; a cached rerun showed the original step times. ≤ 30 lines, none twice, the output
    last; a rerun from the cache shows its route, untimed, and says it came from the cache."""
    from ptconvert.cli import main

    out = tmp_path / "bert-onnx"
    args = [str(samples["hf_bert"]), "--to", "ONNX", "--dynamic-batch", "-o", str(out)]
    texts = []
    for _ in range(2):
        assert main([*args, "--force"]) == 0
        texts.append(capsys.readouterr().out)
    for text in texts:
        lines = text.rstrip("\n").splitlines()
        assert len(lines) <= 30, text
        twice = [line for line in set(lines) if lines.count(line) > 1 and line.strip()]
        assert not twice, text
        assert lines[-1] == f"output: {out}", text
    assert "step " in texts[0] and "route: " not in texts[0] and "from the cache" not in texts[0]
    assert "route: read_weights → " in texts[1] and "from the cache" in texts[1], texts[1]
    assert "step " not in texts[1], texts[1]
