"""The public API: the names it pins, and that a library call gives the CLI's guarantees."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

import ptconvert

PUBLIC = {
    "Detection",
    "FileInfo",
    "InputError",
    "MissingRequirementError",
    "ModelRaisedError",
    "NeedsTrustError",
    "Options",
    "PtconvertError",
    "RuntimeDiedError",
    "UnsafeInputError",
    "UnsupportedConversionError",
    "UsageError",
    "VerificationError",
    "__version__",
    "bench",
    "cache_clear",
    "cache_info",
    "convert",
    "convert_every",
    "convert_many",
    "describe",
    "detect",
    "format_names",
    "generate",
    "optimize",
    "options",
    "plan",
    "scan",
    "verify",
}


def test_the_public_names_are_pinned() -> None:
    assert set(ptconvert.__all__) == PUBLIC
    for name in PUBLIC - {"__version__"}:
        value = getattr(ptconvert, name)
        assert value.__doc__, name  # each documented
    for name in ("convert", "options", "plan", "scan", "verify", "bench"):
        assert callable(getattr(ptconvert, name))  # not the subpackage of the same name


def test_unknown_options_are_a_usage_error() -> None:
    with pytest.raises(ptconvert.UsageError, match="dynamic_batches"):
        ptconvert.options(dynamic_batches=True)


def test_convert_scans_converts_and_names_its_check(
    samples: dict[str, Path], tmp_path: Path
) -> None:
    import contextlib

    from ptconvert import progress

    shown: list[str] = []

    class Recorder:  # a pipeline's own progress display
        def step(self, name: str) -> Any:
            shown.append(name)
            return contextlib.nullcontext()

        def bar(self, name: str, total: int, unit: str = "") -> Any:
            return contextlib.nullcontext(lambda amount=1: None)

    progress.set_reporter(Recorder())
    try:
        program = ptconvert.convert(
            samples["mlp_zip"],
            "pt2",
            tmp_path / "m.pt2",
            model="fixtures.models:MLP",
            inputs=["x:2x8:float32"],
            dynamic_batch=True,
        )
    finally:
        progress.set_reporter(None)
    assert "module → exported (torch.export)" in shown
    assert "running the written file in a fresh process" in shown
    assert program.check == "parity" and program.parity is not None
    assert program.parity.status == "pass"
    assert [s.batch for s in program.parity.sizes] == [1, 2, 3, 5, 7]
    assert '"check": "parity"' in program.to_json()
    weights = ptconvert.convert(samples["mlp_scripted"], "safetensors", tmp_path / "w.st")
    assert weights.check == "bitwise" and weights.weights.verification is not None
    assert weights.weights.verification.status == "pass"
    with safe_open(tmp_path / "w.st", "pt") as f:
        assert set(f.keys()) == set(torch.jit.load(str(samples["mlp_scripted"])).state_dict())
    copy = ptconvert.convert(samples["mlp_pt2"], "pt2", tmp_path / "c.pt2")
    assert copy.check == "copy"
    unchecked = ptconvert.convert(samples["mlp_zip"], "pt", tmp_path / "u.pt", verify=False)
    assert unchecked.check == "none"


def test_convert_refuses_what_the_scanner_refuses(tmp_path: Path) -> None:
    import pickle

    class Payload:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, ("true",))

    (tmp_path / "evil.pt").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(ptconvert.UnsafeInputError):
        ptconvert.convert(tmp_path / "evil.pt", "safetensors", tmp_path / "out.st")
    assert not (tmp_path / "out.st").exists()


def test_shard_options_are_not_dropped_on_a_program_route(
    samples: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(ptconvert.UnsupportedConversionError, match="max-shard-size"):
        ptconvert.convert(
            samples["mlp_zip"], "pt2", tmp_path / "m.pt2", max_shard_size="1MB",
            model="fixtures.models:MLP", inputs=["x:2x8:float32"],
        )  # fmt: skip


def test_the_guides_pipeline_runs_as_a_script(tmp_path: Path) -> None:
    """docs/guide.md's code, as written: nets.py, then the pipeline saved as a script without a
    ``__main__`` guard and run as users run it. The ONNX check's runtime process re-imported
    the script, ran the pipeline again and died ("its process died loading")."""
    import subprocess
    import sys

    text = (Path(__file__).parent.parent / "docs" / "guide.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    nets, pipeline = blocks
    (tmp_path / "nets.py").write_text(nets)
    (tmp_path / "pipeline.py").write_text(pipeline)
    proc = subprocess.run(
        [sys.executable, "pipeline.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'sess.run(None, {"x": …})' in proc.stdout
    program = torch.export.load(tmp_path / "net.pt2").module()
    assert program(torch.randn(3, 8)).shape == (3, 4)


def test_the_api_names_still_lead_into_their_modules() -> None:
    """``ptconvert.verify`` is a function, and the way into ptconvert/verify/ as before."""
    import importlib

    check = importlib.import_module("ptconvert.verify.check")
    assert ptconvert.verify.check is check
    exec("import ptconvert.convert.engine as e\nassert e.convert_program", {})
    assert ptconvert.scan.scanner.scan_file is not ptconvert.scan
    assert "candidate" in ptconvert.verify.__doc__


@pytest.mark.parametrize("sizes", ["1,x", "0", ","])
def test_bad_batch_sizes_are_a_usage_error(
    samples: dict[str, Path], sizes: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import run_cli

    code, report, _ = run_cli(["bench", str(samples["mlp_pt2"]), "--batch-sizes", sizes], capsys)
    assert code == 2 and "--batch-sizes" in report["error"]["message"]


@pytest.mark.parametrize(
    ("keywords", "said"),
    [
        ({"strict": "bogus"}, "strict='bogus' is not one of auto, strict, non-strict"),
        ({"max_shard_size": 300}, "max_shard_size is a size such as '5GB'"),
        ({"inputs": [2, 8]}, "inputs is a list of strings"),
        ({"dynamic": ["x"]}, "--dynamic 'x' is not NAME:AXIS[:MIN:MAX]"),
        ({"device": "tpu"}, "device='tpu' is not one of cpu, cuda"),
        # a target's own options (Format.options_class), checked the same way
        ({"pte_backend": "cuda"}, "pte_backend='cuda' is not one of xnnpack, portable"),
        ({"opset": "17"}, "opset is a positive integer, got '17'"),
        ({"aoti_options": ["a=1"]}, "aoti_options is a dict"),
    ],
)
def test_option_values_are_checked_as_the_cli_checks_them(
    samples: dict[str, Path], keywords: dict[str, Any], said: str
) -> None:
    with pytest.raises(ptconvert.UsageError, match=re.escape(said)):
        ptconvert.plan(samples["mlp_zip"], "pt2", model="fixtures.models:MLP", **keywords)


def test_one_input_spec_as_a_string_and_a_target_in_capitals_are_taken(
    samples: dict[str, Path],
) -> None:
    """Issue 44: ``inputs="x:2x8:float32"`` was refused and ``--to ONNX`` unknown."""
    p = ptconvert.plan(
        samples["mlp_zip"], "PT2", model="fixtures.models:MLP", inputs="x:2x8:float32"
    )
    assert p.dst == "pt2" and p.runnable, p.missing


def test_an_unknown_target_lists_only_the_targets_a_route_writes(samples: dict[str, Path]) -> None:
    with pytest.raises(ptconvert.UsageError, match="unknown target format 'foo'") as caught:
        ptconvert.plan(samples["mlp_zip"], "foo")
    listed = str(caught.value).split("known:")[1]
    assert "onnx" in listed and "gguf" in listed
    assert "hf" not in listed.replace(",", " ").split() and "sharded" not in listed


def test_plan_checks_the_inputs_the_conversion_would_parse(samples: dict[str, Path]) -> None:
    with pytest.raises(ptconvert.UsageError, match="unknown dtype 'flot'"):
        ptconvert.plan(samples["mlp_zip"], "pt2", inputs=["x:2x8:flot"])


def test_a_sharded_target_names_the_option_that_writes_it(samples: dict[str, Path]) -> None:
    with pytest.raises(ptconvert.UsageError) as caught:
        ptconvert.convert(samples["mlp_zip"], "sharded")
    assert caught.value.hint == "use --to safetensors --max-shard-size 5GB"


def test_a_detection_is_a_result_like_the_others(samples: dict[str, Path]) -> None:
    d = ptconvert.detect(samples["mlp_zip"])
    assert d.to_dict() == {"path": str(samples["mlp_zip"]), "format": "pt", "layout": "zip"}
