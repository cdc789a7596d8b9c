"""The converter graph: routes, missing needs, fallbacks, and programs that match eager."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from fixtures.models import MLP, ControlFlow, FirstColumns, LabelledGate, SmallCNN, seeded
from ptconvert.convert.engine import convert_program
from ptconvert.convert.graph import edges, plan
from ptconvert.errors import MissingRequirementError, VerificationError
from ptconvert.options import Options
from tests.conftest import run_cli


def test_plan_routes_and_missing_needs(samples: dict[str, Path], capsys) -> None:
    p = plan("pt", "pt2", frozenset({"model_spec", "example_inputs"}))
    assert [e.dst for e in p.edges] == ["weights", "module", "exported", "pt2"] and p.runnable
    code, out, _ = run_cli(["plan", str(samples["mlp_zip"]), "--to", "pt2"], capsys)
    assert code == 5 and not out["runnable"]
    assert "--model" in out["missing"]["model_spec"]
    assert "safetensors → module" not in out["missing"]["model_spec"]
    code, out, _ = run_cli(["plan", str(samples["hf_bert"]), "--to", "pt2"], capsys)
    assert code == 0 and out["runnable"]
    code, out, _ = run_cli(["plan", str(samples["cnn_module"]), "--to", "torchscript"], capsys)
    assert code == 5 and "trust" in out["missing"]


def test_plan_takes_every_option_of_the_conversion(samples: dict[str, Path], capsys) -> None:
    args = ["--model", "fixtures.models:MLP", "--dynamic-batch", "--dynamic", "x:0:1:64"]
    args += ["--method", "trace", "--export-mode", "strict", "-o", "unused.pt2", "--no-verify"]
    code, out, _ = run_cli(["plan", str(samples["mlp_zip"]), "--to", "pt2", *args], capsys)
    assert code == 0 and out["runnable"] and out["steps"][-1]["to"] == "pt2"


def test_formats_graph_outputs(capsys) -> None:
    from ptconvert.cli import main

    assert main(["formats", "--graph", "mermaid"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("graph LR") and text.count("-->") == len(edges())
    assert main(["formats", "--graph", "dot"]) == 0
    assert "digraph ptconvert" in capsys.readouterr().out


def _fresh_process_check(path: Path, kind: str, batches: tuple[int, ...], width: int) -> None:
    """Load the artifact in a new interpreter and run it at several batch sizes."""
    load = "torch.export.load(p).module()" if kind == "pt2" else "torch.jit.load(p)"
    code = (
        "import sys, torch; p = sys.argv[1]; m = " + load + "\n"
        f"for b in {batches!r}:\n"
        f"    y = m(torch.randn(b, {width}))\n"
        "    assert y.shape[0] == b, y.shape\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_state_dict_to_pt2_with_dynamic_batch(tmp_path: Path) -> None:
    src = tmp_path / "mlp.pt"
    model = seeded(MLP())
    torch.save({f"_orig_mod.{k}": v for k, v in model.state_dict().items()}, src)  # torch.compile
    opts = Options(model="fixtures.models:MLP", inputs=["x:1x8:float32"], dynamic_batch=True)
    report = convert_program(src, "pt2", tmp_path / "mlp.pt2", opts)
    assert report.route == [
        "pt → weights",
        "weights → module",
        "module → exported",
        "exported → pt2",
    ]
    assert any("batch 1" in n for n in report.notes)  # the batch-1 example was re-traced at 2
    assert report.parity is not None and [s.batch for s in report.parity.sizes] == [1, 2, 3, 5, 7]
    _fresh_process_check(tmp_path / "mlp.pt2", "pt2", (1, 2, 9), 8)
    ep = torch.export.load(tmp_path / "mlp.pt2")
    x = torch.randn(5, 8)
    torch.testing.assert_close(ep.module()(x), model(x))


def test_control_flow_reaches_pt2_through_torchscript(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The converter names the program's input ``x_1``: the check still resizes the model's
    ``x`` at every size it compares and probes, and says the range of ``x``."""
    import ptconvert.verify.parity as parity

    src = tmp_path / "cf.pt"
    model = seeded(ControlFlow())
    torch.save(model.state_dict(), src)
    opts = Options(
        model="fixtures.models:ControlFlow", inputs=["x:2x6:float32"], dynamic_batch=True
    )
    seen: set[int] = set()
    run_model = parity.run_model

    def watched(fn: Any, inputs: dict[str, Any], who: str) -> Any:
        seen.add(inputs["x"].shape[0])
        return run_model(fn, inputs, who)

    monkeypatch.setattr(parity, "run_model", watched)
    report = convert_program(src, "pt2", tmp_path / "cf.pt2", opts)
    assert {1, 3, 5, 7, 32} <= seen, seen  # not the example's batch alone
    assert list(report.dynamic_range) == ["x dim 0"], report.dynamic_range
    failed = [s for s in report.steps if s.status == "failed"]
    assert (
        failed
        and failed[0].step == "export"
        and "data-dependent" in (failed[0].error or "").lower()
    )
    assert "module → torchscript" in report.route and "torchscript → exported" in report.route
    program = torch.export.load(tmp_path / "cf.pt2").module()
    for b in (1, 3, 5, 7):
        for sign in (1.0, -1.0):  # both branches
            x = sign * (torch.rand(b, 6) + 0.1)
            torch.testing.assert_close(program(x), model(x))


def test_a_batch_named_otherwise_than_the_models_inputs_still_moves_them() -> None:
    """A program whose batched inputs carry no name of the model's (TS2EP's x_1, where no
    order maps them back): the check resizes every input with the batch, and says so, instead
    of pinning them all and comparing at the example's size alone."""
    from ptconvert import _compat
    from ptconvert.convert.program_check import _pin_unbatched
    from ptconvert.convert.state import RunState
    from ptconvert.model.inputs import from_specs, parse_input

    scripted = torch.jit.script(seeded(ControlFlow()).eval())
    ep = _compat.torch_api.ts2ep_converter()(scripted, (torch.randn(2, 6),)).convert()
    state = RunState(Path("cf.pt"), "pt", exported=ep)
    state.inputs = from_specs([parse_input("x:2x6:float32")])
    _pin_unbatched(state, Options(dynamic_batch=True))
    assert state.inputs.at(5)["x"].shape == (5, 6)
    assert any("not named as the model's" in n for n in state.notes), state.notes


class _Biased(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + bias


@pytest.mark.parametrize("to", ["pt2", pytest.param("aoti", marks=pytest.mark.slow)])
def test_a_converted_torchscript_program_gets_each_input_in_its_place(
    to: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A TorchScript file's inputs given in another order than ``forward`` takes them: its
    converted program (inputs renamed x_1, bias_1) is checked with x as x and bias as bias,
    in memory and by an AOTI package's runner, which binds them by position."""
    torch.manual_seed(0)
    scripted = torch.jit.script(_Biased().eval())
    src = tmp_path / "biased.pt"
    scripted.save(str(src))
    out = tmp_path / f"biased.{to}.pt2"
    args = [str(src), "--to", to, "--input", "bias:2x4:float32", "--input", "x:2x8:float32"]
    code, report, _ = run_cli([*args, "-o", str(out), "--no-cache"], capsys)
    assert code == 0, report
    assert "torchscript → exported" in report["route"], report["route"]
    x, bias = torch.randn(2, 8), torch.randn(2, 4)
    if to == "pt2":
        got = torch.export.load(str(out)).module()(x, bias)
    else:
        got = torch._inductor.aoti_load_package(str(out))(x, bias)
    torch.testing.assert_close(got, scripted(x, bias))


class _Rated(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, sr: int) -> torch.Tensor:
        return self.lin(x) * (sr // 8000)


def test_a_converted_torchscript_program_with_a_scalar_first_reaches_onnx(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--input sr::int64=16000`` before ``x``: the ONNX graph drops the scalar and keeps the
    converter's name ``x_1``; the check feeds x there, and the report's call and range lines
    name what the file takes."""
    import onnxruntime as ort

    torch.manual_seed(0)
    scripted = torch.jit.script(_Rated().eval())
    src = tmp_path / "rated.pt"
    scripted.save(str(src))
    out = tmp_path / "rated.onnx"
    args = [str(src), "--to", "onnx", "--input", "sr::int64=16000", "--input", "x:2x4:float32"]
    code, report, _ = run_cli([*args, "--dynamic-batch", "-o", str(out), "--no-cache"], capsys)
    assert code == 0, report
    (name,) = [i.name for i in ort.InferenceSession(str(out)).get_inputs()]
    face = report["interface"]
    assert face["inputs"] == [name] and f'"{name}"' in face["call"], face
    assert any(a.startswith(f"{name} dim 0: batch") for a in face["accepts"]), face["accepts"]
    x = torch.randn(5, 4)
    (got,) = ort.InferenceSession(str(out)).run(None, {name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), scripted(x, 16000))


def test_frozen_trace_is_never_a_success(tmp_path: Path) -> None:
    src = tmp_path / "cf.pt"
    torch.save(seeded(ControlFlow()).state_dict(), src)
    opts = Options(model="fixtures.models:ControlFlow", inputs=["x:2x6:float32"], method="trace")
    with pytest.raises(VerificationError, match="differs from eager"):
        convert_program(src, "torchscript", tmp_path / "cf.ts", opts)
    assert not (tmp_path / "cf.ts").exists()


def test_a_trace_fallback_that_froze_an_input_value_is_refused(tmp_path: Path, capsys) -> None:
    """Scripting fails, the trace freezes ``n = int(n_cols[0].item())``; the inputs' rows
    repeat at every batch size (an ``--example-inputs`` file), so only other values show it."""
    from safetensors.torch import save_file

    src, examples = tmp_path / "w.pt", tmp_path / "inputs.safetensors"
    torch.save(seeded(FirstColumns()).state_dict(), src)
    save_file({"x": torch.randn(2, 8), "n_cols": torch.tensor([3, 5])}, examples)
    args = [str(src), "--to", "torchscript", "--model", "fixtures.models:FirstColumns"]
    args += ["--example-inputs", str(examples), "-o", str(tmp_path / "out.ts")]
    code, out, _ = run_cli(args, capsys)
    assert code == 6 and "froze a value" in out["error"]["message"], out
    assert not (tmp_path / "out.ts").exists()


def test_when_every_route_fails_each_routes_error_is_shown(tmp_path: Path, capsys) -> None:
    """export fails (a data-dependent branch), the fallback too (script, then trace): the
    direct route's error is said beside the fallback's, not dropped."""
    src = tmp_path / "gate.pt"
    torch.save(seeded(LabelledGate()).state_dict(), src)
    args = [str(src), "--to", "pt2", "--model", "fixtures.models:LabelledGate"]
    code, out, _ = run_cli(
        [*args, "--input", "x:2x8:float32", "-o", str(tmp_path / "g.pt2")], capsys
    )
    message = out["error"]["message"]
    assert code != 0 and "export: torch.export failed" in message, message
    assert "data-dependent" in message.lower() and "tracing failed" in message, message


@pytest.mark.parametrize(
    ("flags", "named", "not_named"),
    [
        ({}, "no --dynamic option was passed", "drop"),
        ({"dynamic_batch": True}, "drop --dynamic-batch for", "--dynamic/"),
        ({"dynamic": ["x:1"]}, "drop --dynamic for", "--dynamic-batch"),
    ],
)
def test_dynamic_dims_hints_name_only_the_options_passed(
    flags: dict[str, Any], named: str, not_named: str
) -> None:
    from ptconvert.convert.exporting import _fix_for, dims_hint

    hint = dims_hint(Options(**flags), "that dimension")
    assert named in hint and not_named not in hint, hint
    violated = _fix_for(
        ["non-strict: UserError: Constraints violated (L['x'].size()[0])!"], Options(**flags)
    )
    assert named.replace(" for", "") in violated and not_named not in violated, violated


def test_torchscript_script_and_weights_back(tmp_path: Path) -> None:
    src = tmp_path / "cnn.pt"
    model = seeded(SmallCNN())
    torch.save(model.state_dict(), src)
    opts = Options(model="fixtures.models:SmallCNN", inputs=["x:2x3x8x8:float32"])
    report = convert_program(src, "torchscript", tmp_path / "cnn.ts", opts)
    assert report.parity is not None and report.parity.status == "pass"
    loaded = torch.jit.load(str(tmp_path / "cnn.ts"))
    x = torch.randn(3, 3, 8, 8)
    torch.testing.assert_close(loaded(x), model(x))
    # weights back out of the TorchScript archive, without the Python source
    back = convert_program(tmp_path / "cnn.ts", "safetensors", tmp_path / "cnn.safetensors")
    assert back.route[0] == "torchscript → weights"
    assert back.check == "bitwise"  # the graph's weights targets are checked too
    from safetensors.torch import load_file

    sd = load_file(tmp_path / "cnn.safetensors")
    assert sd.keys() == model.state_dict().keys()
    assert all(torch.equal(sd[k], v) for k, v in model.state_dict().items())


class _Stateful(torch.nn.Module):
    """silero-vad's way: runtime state kept as a plain tensor attribute, not a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("window", torch.hann_window(8))
        self._state = torch.zeros(2, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin(x * self.window) + self._state[0]
        self._state = out.detach()[:1].expand(2, 8).clone()
        return out


class _Detector(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = _Stateful()
        self.blocks = torch.nn.ModuleList([_Stateful()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x)
        for block in self.blocks:
            x = block(x)
        return x


def test_torchscript_runtime_state_is_not_written_as_weights(tmp_path: Path, capsys) -> None:
    """The weights of a TorchScript archive are its state_dict(): a tensor attribute that is
    not a parameter or buffer (at the top and in a submodule) is named in a note."""
    from safetensors.torch import load_file

    model = torch.jit.script(_Detector())
    model(torch.randn(1, 8))  # the state changes as the model runs
    torch.jit.save(model, tmp_path / "vad.jit")
    out = tmp_path / "w.safetensors"
    code, report, _ = run_cli(
        [str(tmp_path / "vad.jit"), "--to", "safetensors", "-o", str(out)], capsys
    )
    assert code == 0, report
    assert load_file(out).keys() == model.state_dict().keys()
    notes = report["notes"]
    assert any("first._state" in n and "blocks.0._state" in n for n in notes), notes


def test_pt2_weights_back_to_safetensors(samples: dict[str, Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file

    convert_program(samples["mlp_pt2"], "safetensors", tmp_path / "w.safetensors")
    ep = torch.export.load(samples["mlp_pt2"])
    sd = load_file(tmp_path / "w.safetensors")
    assert sd.keys() == ep.state_dict.keys()
    assert all(torch.equal(sd[k], v) for k, v in ep.state_dict.items())


def test_missing_model_spec_names_the_option(samples: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(MissingRequirementError) as err:
        convert_program(samples["mlp_zip"], "pt2", tmp_path / "x.pt2")
    assert "model_spec" in err.value.message and "--model" in (err.value.hint or "")


HF_MODELS = ["hf_bert", "hf_gpt2_bin", "hf_llama", "hf_vit", "hf_t5", "hf_whisper"]


def _hf_params(default: set[str]) -> list:
    """HF_MODELS with all but ``default`` marked slow: one tiny model per kind in the default
    run (`make test`), every model in CI's slow step."""
    return [pytest.param(n, marks=() if n in default else pytest.mark.slow) for n in HF_MODELS]


# pt2 by default: ViT (vision), Whisper (encoder-decoder, audio features); BERT (text encoder)
# in test_example_inputs_file_and_dynamic_sequence, GPT-2 (decoder-only, tied .bin) in
# test_real_models.test_directory_without_architectures_takes_the_class_its_weights_fit
@pytest.mark.parametrize("name", _hf_params({"hf_vit", "hf_whisper"}))
def test_hf_directory_to_pt2(samples: dict[str, Path], name: str, tmp_path: Path) -> None:
    report = convert_program(samples[name], "pt2", tmp_path / "m.pt2", Options(dynamic_batch=True))
    assert report.route[-2:] == ["module → exported", "exported → pt2"]
    assert report.parity is not None and report.parity.status == "pass"
    # 1, 2, 3 always; 5 and 7 while the model's calls are cheap (a loaded machine may drop them)
    sizes = [s.batch for s in report.parity.sizes]
    assert sizes[:3] == [1, 2, 3] and set(sizes) <= {1, 2, 3, 5, 7}, sizes
    assert report.dynamic_range


# TorchScript by default: GPT-2, ViT and Whisper here; BERT in test_real_models.py
# (test_torchscript_keeps_the_models_input_and_output_names, the pretraining checkpoint), T5 in
# test_t5_directory_without_architectures[torchscript]
@pytest.mark.parametrize("name", _hf_params({"hf_gpt2_bin", "hf_vit", "hf_whisper"}))
def test_hf_directory_to_torchscript(samples: dict[str, Path], name: str, tmp_path: Path) -> None:
    report = convert_program(samples[name], "torchscript", tmp_path / "m.ts", Options())
    assert report.parity is not None and report.parity.status == "pass"
    # the file written takes the inputs the report tells the user to call it with
    program = torch.jit.load(str(tmp_path / "m.ts"))
    assert isinstance(program, torch.jit.ScriptModule)
    names = [a.name for a in program.forward.schema.arguments[1:]]
    assert names[: len(report.interface["inputs"])] == report.interface["inputs"]
    assert report.interface["outputs"]


# slow: every pt2 conversion is loaded in a fresh process with only torch imported (the engine's
# own check, in test_hf_directory_to_pt2 by default), and test_state_dict_to_pt2_with_dynamic_batch
# runs its program in one
@pytest.mark.slow
def test_hf_program_runs_in_a_fresh_process(samples: dict[str, Path], tmp_path: Path) -> None:
    convert_program(samples["hf_llama"], "pt2", tmp_path / "l.pt2", Options(dynamic_batch=True))
    code = (
        "import sys, torch\n"
        "m = torch.export.load(sys.argv[1]).module()\n"
        "for b in (1, 2, 6):\n"
        "    ids = torch.randint(0, 99, (b, 16))\n"
        "    out = m(input_ids=ids, attention_mask=torch.ones_like(ids))\n"
        "    assert out['logits'].shape == (b, 16, 99), out['logits'].shape\n"
        "assert 'transformers' not in sys.modules\n"
        "print('ok')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "l.pt2")], capture_output=True, text=True
    )
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_bound_method_factory_is_wrapped(tmp_path: Path) -> None:
    (tmp_path / "predictor.py").write_text(
        "import torch\n"
        "from fixtures.models import MLP, seeded\n"
        "class Predictor:\n"
        "    def __init__(self):\n"
        "        self.model = seeded(MLP())\n"
        "    def _predict(self, x):\n"
        "        return self.model(x).softmax(-1)\n"
        "def make():\n"
        "    return Predictor()._predict\n"
    )
    model = seeded(MLP(), seed=5)
    src = tmp_path / "w.pt"
    torch.save({f"model.{k}": v for k, v in model.state_dict().items()}, src)
    opts = Options(model=f"{tmp_path / 'predictor.py'}:make", inputs=["x:2x8:float32"])
    report = convert_program(
        src,
        "pt2",
        tmp_path / "p.pt2",
        opts,
    )
    assert report.parity is not None and report.parity.status == "pass"
    x = torch.randn(2, 8)
    torch.testing.assert_close(
        torch.export.load(tmp_path / "p.pt2").module()(x), model(x).softmax(-1)
    )


def test_whole_module_pickle_with_trust(samples: dict[str, Path], tmp_path: Path) -> None:
    opts = Options(inputs=["x:2x3x8x8:float32"], trust=True, dynamic_batch=True)
    report = convert_program(samples["cnn_module"], "pt2", tmp_path / "cnn.pt2", opts)
    assert report.route[0] == "pt → module" and report.parity and report.parity.status == "pass"
    assert any("--trust" in n for n in report.notes)


def test_example_inputs_file_and_dynamic_sequence(samples: dict[str, Path], tmp_path: Path) -> None:
    from safetensors.torch import save_file

    ids = torch.randint(0, 99, (2, 12))
    save_file(
        {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, tmp_path / "in.safetensors"
    )
    opts = Options(
        example_inputs=tmp_path / "in.safetensors",
        dynamic_batch=True,
        dynamic=["input_ids:1:4:64", "attention_mask:1:4:64"],
    )
    report = convert_program(samples["hf_bert"], "pt2", tmp_path / "b.pt2", opts)
    assert report.parity is not None and report.parity.status == "pass"
    program = torch.export.load(tmp_path / "b.pt2").module()
    for seq in (5, 30):
        x = torch.randint(0, 99, (3, seq))
        out = program(input_ids=x, attention_mask=torch.ones_like(x))
        assert out["last_hidden_state"].shape == (3, seq, 32)


def test_frozen_inputs_written_in_place_are_cloned(tmp_path: Path) -> None:
    from fixtures.models import WritesInput

    src = tmp_path / "w.pt"
    model = seeded(WritesInput())
    torch.save(model.state_dict(), src)
    opts = Options(model="fixtures.models:WritesInput", dynamic_batch=True)  # its example_inputs
    report = convert_program(src, "pt2", tmp_path / "w.pt2", opts)
    assert any("retried with the inputs cloned" in n for n in report.notes)
    assert report.parity is not None and report.parity.status == "pass"
    x = torch.randn(3, 8)
    torch.testing.assert_close(
        torch.export.load(tmp_path / "w.pt2").module()(x.clone()), model(x.clone())
    )


def test_torchscript_to_pt2_without_source(samples: dict[str, Path], tmp_path: Path) -> None:
    """A legacy TorchScript model reaches pt2 with only its archive and an input spec."""
    opts = Options(inputs=["x:2x8:float32"], dynamic_batch=True)
    report = convert_program(samples["mlp_scripted"], "pt2", tmp_path / "m.pt2", opts)
    assert report.route == ["torchscript → exported", "exported → pt2"]
    assert report.parity is not None and report.parity.status == "pass"
    ts = torch.jit.load(str(samples["mlp_scripted"]))
    x = torch.randn(4, 8)
    torch.testing.assert_close(torch.export.load(tmp_path / "m.pt2").module()(x), ts(x))


FIXTURE_MODELS = {
    "mlp": ("fixtures.models:MLP", "x:2x8:float32", MLP),
    "cnn": ("fixtures.models:SmallCNN", "x:2x3x8x8:float32", SmallCNN),
    "control_flow": ("fixtures.models:ControlFlow", "x:2x6:float32", ControlFlow),
}


# by default: each prefix and each target once (a plain state dict goes through the CLI by default
# in test_static_program_says_which_shapes_it_accepts); the CNN's and the control-flow model's
# routes run by default in test_whole_module_pickle_with_trust,
# test_torchscript_script_and_weights_back and test_control_flow_reaches_pt2_through_torchscript
DEFAULT_CLI_CASES = {("mlp", "pt2", "module."), ("mlp", "torchscript", "_orig_mod.")}
CLI_CASES = [
    pytest.param(*case, marks=() if case in DEFAULT_CLI_CASES else pytest.mark.slow)
    for case in [
        *[("mlp", t, p) for t in ("pt2", "torchscript") for p in ("", "_orig_mod.", "module.")],
        *[(n, t, "") for n in ("cnn", "control_flow") for t in ("pt2", "torchscript")],
    ]
]


@pytest.mark.parametrize(("name", "target", "prefix"), CLI_CASES)
def test_cli_converts_fixture_state_dicts(name, target, prefix, tmp_path, capsys) -> None:
    """`ptconvert SRC --to pt2|torchscript --dynamic-batch` on plain, torch.compile'd and
    DDP-saved state dicts: verified at batch 1–7, read back by torch's loader, equal to eager."""
    factory, spec, cls = FIXTURE_MODELS[name]
    model = seeded(cls())
    src = tmp_path / "sd.pt"
    torch.save({prefix + k: v for k, v in model.state_dict().items()}, src)
    out = tmp_path / f"out.{target}"
    args = [str(src), "--to", target, "-o", str(out), "--model", factory, "--input", spec]
    code, report, _ = run_cli([*args, "--dynamic-batch"], capsys)
    assert code == 0, report
    assert report["parity"]["status"] == "pass"
    assert [s["batch"] for s in report["parity"]["sizes"]] == [1, 2, 3, 5, 7]
    if prefix:  # it loaded because the prefix was stripped: kept, no key fits the model
        kept = [str(src), "--to", target, "-o", str(tmp_path / "kept"), "--model", factory]
        code, report, _ = run_cli([*kept, "--input", spec, "--keep-prefix"], capsys)
        assert code == 4 and f"unexpected ['{prefix}fc1.weight'" in report["error"]["message"]
    shape = [int(d) for d in spec.split(":")[1].split("x")]
    x = torch.randn(4, *shape[1:])
    program = torch.export.load(out).module() if target == "pt2" else torch.jit.load(str(out))
    torch.testing.assert_close(program(x), model(x))


def test_pt2_sample_inputs_are_example_inputs(samples: dict[str, Path]) -> None:
    from ptconvert.convert.state import RunState
    from ptconvert.formats.pt2.edges import load_pt2

    state = RunState(samples["mlp_pt2"], "pt2")
    load_pt2(state, Options())
    assert state.inputs is not None and state.inputs.at(3)["x"].shape == (3, 8)


@pytest.mark.parametrize("name", ["mlp_zip", "mlp_pt2", "mlp_scripted", "cnn_safetensors"])
def test_a_weights_conversion_runs_the_route_plan_shows(
    name: str, samples: dict[str, Path], tmp_path: Path, capsys
) -> None:
    """Weights to weights is a route of the graph: the steps ``plan`` shows are the steps the
    conversion runs and reports (a program's weights read symbolically, not by loading it),
    its own format included (a rewrite, checked bitwise, not a byte copy)."""
    src = samples[name]
    code, planned, _ = run_cli(["plan", str(src), "--to", "safetensors"], capsys)
    assert code == 0 and planned["runnable"], planned
    out = tmp_path / "out.safetensors"
    code, report, _ = run_cli([str(src), "--to", "safetensors", "-o", str(out)], capsys)
    assert code == 0, report
    steps = [s["step"] for s in report["steps"]]
    assert [s["step"] for s in planned["steps"]] == steps == ["read_weights", "write_weights"]
    assert report["route"] == [f"{planned['from']} → weights", "weights → safetensors"]
    assert report["check"] == "bitwise" and report["weights"]["verification"]["status"] == "pass"
