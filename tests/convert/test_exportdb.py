"""Verdicts on models nobody here wrote: torch's own ExportDB examples
(``torch._export.db.examples``), converted as a user would (``--model module:Class`` and the
example's own inputs in a file). A wrong artifact never exits 0; a correct one is not refused
for a probe that makes the eager model itself fail; each route's failure is named."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from ptconvert.errors import UnsupportedConversionError, VerificationError
from tests.conftest import run_cli

EXAMPLES = "torch._export.db.examples"


def example(name: str) -> Any:
    """The ExportDB example ``name``'s module (its ``model`` and ``example_args``)."""
    return importlib.import_module(f"{EXAMPLES}.{name}")


def convert_example(
    name: str, to: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, Any, Path]:
    """``ptconvert --model EXAMPLES.name:Class --to to --example-inputs FILE``: the example's
    tensors saved under its forward's names; (exit code, JSON report, output path)."""
    import inspect

    from safetensors.torch import save_file

    mod = example(name)
    names = list(inspect.signature(mod.model.forward).parameters)
    inputs = tmp_path / f"{name}.safetensors"
    save_file({n: a.contiguous() for n, a in zip(names, mod.example_args, strict=False)}, inputs)
    out = tmp_path / f"{name}.out"
    args = ["--model", f"{EXAMPLES}.{name}:{type(mod.model).__name__}", "--to", to]
    args += ["--example-inputs", str(inputs), "-o", str(out), "--no-cache", *extra]
    code, report, _ = run_cli(args, capsys)
    return code, report, out


def test_a_trace_that_froze_a_size_read_by_item_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``torch.zeros((x.item(), 5))``: scripting fails, the trace records ``zeros([4, 5])``.
    Rolling a one-value tensor leaves it as it was, so the trace check saw the same graph and
    the file (shape (4, 5) at x=2) passed; the value itself moved shows the frozen size."""
    name = "constrain_as_size_example"
    code, report, out = convert_example(name, "torchscript", tmp_path, capsys)
    assert code == VerificationError.exit_code, report
    assert "froze a value" in report["error"]["message"]
    assert not out.exists()


@pytest.mark.parametrize(
    "name", ["dynamic_shape_assert", "list_contains", "nested_function", "optional_input"]
)
def test_a_size_the_eager_model_rejects_is_skipped_not_a_refusal(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check resized dim 0 of inputs the model asserts on (``x.shape[0] > 2``), that are
    not batched, or that must agree with a default argument; eager raised there and the
    conversion was refused, blaming the example inputs given. Eager failing at a size says
    nothing of the artifact: the size is skipped, with a note, and the file is eager's."""
    import torch

    code, report, out = convert_example(name, "torchscript", tmp_path, capsys)
    assert code == 0, report
    assert any("the eager model itself raised there" in n for n in report["notes"]), report
    assert any(s["status"] == "skipped" for s in report["parity"]["sizes"])
    mod = example(name)
    torch.testing.assert_close(
        torch.jit.load(str(out))(*mod.example_args), mod.model(*mod.example_args)
    )


def test_auto_traces_when_the_check_refuses_the_scripted_program(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A decorated forward (``func(*args) + 1``): torch.jit.script compiles the undecorated
    function and gives other numbers; ``--method auto`` stopped at the check's refusal though
    its hint's ``--method trace`` works. The check's refusal of one way is the next way's turn."""
    import torch

    code, report, out = convert_example("decorator", "torchscript", tmp_path, capsys)
    assert code == 0, report
    assert any("scripted program failed the parity check" in n for n in report["notes"])
    mod = example("decorator")
    got = torch.jit.load(str(out))(*mod.example_args)
    torch.testing.assert_close(got, mod.model(*mod.example_args))


@pytest.mark.parametrize(
    ("name", "to", "extra", "says"),
    [
        # Python's round on a dynamic size: not among the serializer's symbolic operators
        ("dynamic_shape_round", "pt2", ["--dynamic-batch"], "torch.export.save cannot serialize"),
        # the trace keeps the autograd.Function as a Python call torch.jit.save refuses
        ("autograd_function", "torchscript", [], "torch.jit.save cannot save"),
    ],
)
def test_a_program_torch_cannot_save_is_a_named_refusal(
    name: str,
    to: str,
    extra: list[str],
    says: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Both exited 1, "internal error", with torch's exception: what torch's writer refuses
    is unsupported content (exit 4), said in one line with a hint."""
    code, report, out = convert_example(name, to, tmp_path, capsys, *extra)
    assert code == UnsupportedConversionError.exit_code, report
    error = report["error"]
    assert says in error["message"] and "\n" not in error["message"] and error["hint"]
    assert not out.exists()


def test_a_number_the_model_returns_is_compared_as_an_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``return x.shape[1] + 1`` with dim 1 dynamic: torch.onnx writes the number as an int64
    output, right at every size; the check left eager's number out of its outputs ("0 outputs
    became 1"), refused the file, and the route after it ended in the exporter's error."""
    import numpy as np
    import onnxruntime as ort

    code, report, out = convert_example(
        "scalar_output", "onnx", tmp_path, capsys, "--dynamic", "x:1"
    )
    assert code == 0, report
    session = ort.InferenceSession(str(out))
    (got,) = session.run(None, {"x": np.zeros((3, 7), dtype=np.float32)})
    assert int(got) == 8
    # dim 1 static: the output is a constant, which torch.onnx cannot write; the hint says what
    # to do (it said "--opset may help")
    (tmp_path / "static").mkdir()
    code, report, _ = convert_example("scalar_output", "onnx", tmp_path / "static", capsys)
    assert code == 4 and "--dynamic NAME:AXIS" in report["error"]["hint"], report


@pytest.mark.slow  # AOTInductor's compile: 30-60 s here
def test_a_package_exported_positionally_takes_its_inputs_by_forwards_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch.cond over a closure → AOTI: a package exported positionally was fed the example's
    inputs in the file's order (safetensors lists ``x`` before ``pred``), and the check refused
    it ("input_handles[0]: unmatched dtype, expected kBool, got 6"). The package names forward's
    inputs in its metadata; the runtime feeds them in that order."""
    import torch

    code, report, _ = convert_example(
        "cond_closed_over_variable", "aoti", tmp_path, capsys, "--trust"
    )
    assert code == 0, report
    assert report["interface"]["call"] == "prog(pred, x)", report["interface"]
    prog = torch._inductor.aoti_load_package(report["output"])
    x, model = torch.randn(3, 2), example("cond_closed_over_variable").model
    for pred in (torch.tensor(True), torch.tensor(False)):
        torch.testing.assert_close(prog(pred, x), model(pred, x))


def test_the_interface_names_the_leaves_an_onnx_session_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``forward(self, pos0, tuple0, *myargs, mykw0, **mykwargs)`` → ONNX: the exporter
    flattens ``tuple0`` into ``tuple0_0`` and ``tuple0_1``; the report's ``call`` and ``inputs``
    named ``tuple0``, which the session does not take (and ``example`` left it out)."""
    import numpy as np
    import onnxruntime as ort

    (tmp_path / "fwk.py").write_text(
        f"import torch\nfrom {EXAMPLES}.fn_with_kwargs import FnWithKwargs  # noqa: F401\n\n\n"
        "def example_inputs(batch_size):\n"
        "    g = torch.Generator().manual_seed(batch_size)\n"
        "    def r():\n"
        "        return torch.randn(batch_size, 4, generator=g)\n"
        '    return {"pos0": r(), "tuple0": (r(), r()), "mykw0": r(), "input0": r(), '
        '"input1": r()}\n'
    )
    out = tmp_path / "fwk.onnx"
    args = ["--model", f"{tmp_path / 'fwk.py'}:FnWithKwargs", "--to", "onnx", "-o", str(out)]
    code, report, _ = run_cli([*args, "--no-cache"], capsys)
    assert code == 0, report
    session = ort.InferenceSession(str(out))
    taken = [i.name for i in session.get_inputs()]
    interface = report["interface"]
    assert (
        interface["inputs"]
        == taken
        == ["pos0", "tuple0_0", "tuple0_1", "mykw0", "input0", "input1"]
    )
    assert all(f'"{n}"' in interface["call"] for n in taken), interface["call"]
    assert list(interface["example"]) == taken
    session.run(None, {n: np.ones(interface["example"][n], np.float32) for n in taken})
