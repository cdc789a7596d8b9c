"""The command grammar, JSON mode, exit codes and the import-time promise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ptconvert.cli import main
from tests.conftest import run_cli


def test_bare_conversion_grammar_reaches_convert(samples, tmp_path, capsys) -> None:
    out_path = tmp_path / "w.safetensors"
    code, out, _ = run_cli(
        [str(samples["mlp_zip"]), "--to", "safetensors", "-o", str(out_path)], capsys
    )
    assert code == 0 and out["output"] == str(out_path) and out_path.exists()
    # a program target from a state dict needs the model: said with the option that gives it
    code, out, _ = run_cli([str(samples["mlp_zip"]), "--to", "onnx"], capsys)
    assert code == 5 == out["error"]["exit_code"]
    assert "model_spec" in out["error"]["message"] and "--model" in out["error"]["hint"]
    assert out["error"]["path"] == str(samples["mlp_zip"])


def test_path_named_like_a_subcommand_stays_reachable(samples, tmp_path, capsys) -> None:
    os.chdir(tmp_path)
    Path("info").write_bytes(samples["mlp_zip"].read_bytes())
    code, out, _ = run_cli(["convert", "info", "--to", "pt2"], capsys)
    assert code == 5 and out["error"]["path"] == "info"  # reached: it needs a model spec
    code, out, _ = run_cli(["info", "info"], capsys)
    assert code == 0 and out["format"] == "pt"


def test_info_json_is_only_json(samples: dict[str, Path], capsys) -> None:
    code, out, err = run_cli(["info", str(samples["cnn_safetensors"])], capsys)
    assert code == 0
    assert out["format"] == "safetensors" and out["tensors"] == 9
    assert err == ""


def test_info_human_output(samples: dict[str, Path], capsys) -> None:
    assert main(["info", str(samples["mlp_pt2"])]) == 0
    out = capsys.readouterr().out
    assert "pt2 (archive)" in out and "x: float32[" in out


def test_formats_lists_every_format(capsys) -> None:
    from ptconvert.formats import FORMATS

    code, out, _ = run_cli(["formats"], capsys)
    assert code == 0
    assert [r["name"] for r in out] == [f.name for f in FORMATS]
    assert {"pt", "safetensors", "torchscript", "pt2", "aoti", "onnx", "hf"} <= {
        r["name"] for r in out
    }


def test_usage_error_exit_code(capsys) -> None:
    code, out, _ = run_cli(["info"], capsys)
    assert code == 2 and out["error"]["kind"] == "usage"


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    p = tmp_path / "empty.bin"
    p.write_bytes(b"")
    proc = subprocess.run(
        [sys.executable, "-m", "ptconvert", "--debug", "info", str(p)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "Traceback" in proc.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_anywhere_changes_only_what_is_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """--debug was refused after the arguments ("No such option") and turned an error's exit
    code into 1 (the exception re-raised): it is taken anywhere, like -q and -v, and prints
    the traceback beside the error's own message and code."""
    p = tmp_path / "empty.bin"
    p.write_bytes(b"")
    args = ["--debug", "info", str(p)] if where == "before" else ["info", str(p), "--debug"]
    code = main(args)
    err = capsys.readouterr().err
    assert code == 3, err  # the empty file's own code, as without --debug
    assert "Traceback" in err and "error:" in err and "No such option" not in err


def _modules_after(code: str) -> set[str]:
    probe = f"import sys\n{code}\nprint(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_import_and_help_do_not_import_heavy_packages() -> None:
    heavy = {"torch", "onnx", "transformers", "onnxruntime", "numpy"}
    assert not heavy & _modules_after("import ptconvert")
    help_code = (
        "from ptconvert.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    )
    assert not heavy & _modules_after(help_code)


def test_info_on_safetensors_does_not_import_torch(samples: dict[str, Path]) -> None:
    path = str(samples["cnn_safetensors"])
    code = f"from ptconvert.cli import main\nmain(['info', {path!r}, '--json'])"
    assert "torch" not in _modules_after(code)


def test_missing_optional_dependency_names_the_extra(samples, monkeypatch, capsys) -> None:
    import builtins

    real_import = builtins.__import__

    def no_onnx(name: str, *args, **kwargs):  # the onnx extra is not installed
        if name == "onnx" or name.startswith("onnx."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "onnx", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_onnx)
    code, out, _ = run_cli(["info", str(samples["mlp_onnx"])], capsys)
    assert code == 5 and out["error"]["kind"] == "missing_requirement"
    assert "'onnx'" in out["error"]["message"]
    assert "pip install -e '.[onnx]'" in out["error"]["hint"]


def test_progress_steps_nest_in_one_terminal_display() -> None:
    """A conversion's step holds the comparison's bar: one rich display, both lines shown."""
    import io

    from rich.console import Console

    from ptconvert.render_progress import TerminalProgress

    shown = io.StringIO()
    reporter = TerminalProgress()
    reporter._console = Console(file=shown, force_terminal=True, width=100)
    with reporter.step("exported → pt2"), reporter.bar("batch sizes compared", 3) as advance:
        advance()
        advance()
    with reporter.step("a later step"):
        pass
    text = shown.getvalue()
    assert "exported → pt2" in text and "batch sizes compared" in text and "a later step" in text
    assert reporter._live is None  # the display is closed once every step has ended
