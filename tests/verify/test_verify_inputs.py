"""`ptconvert verify`: inputs bound to the candidate's signature, mismatched names, stateful
models, `--key`, and the model's own errors."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any, Optional

import pytest
import torch
from torch import nn

from fixtures.models import MLP, seeded
from ptconvert.cli import main
from tests.conftest import run_cli

HERE = "tests.verify.test_verify_inputs"


# --- models the CLI builds with --model (importable from this module) ------------------------


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + y


class TwoInputsAB(TwoInputs):
    """The same computation, its inputs named differently."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.lin(a) + b


class TakesInput(nn.Module):
    """``forward(input)`` around an MLP (as nn.Linear names its own input)."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = MLP()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.mlp(input)


class Counter(nn.Module):
    """Counts its calls in a buffer and scales its output by the count."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.lin(x) * self.calls


class Uncounted(Counter):
    """Counter's first call, every time: no state."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * (self.calls + 1)


class Recurrent(nn.Module):
    """Keeps its last hidden state in an attribute and adds it on the next call."""

    # a real type, not a string (postponed annotations): TorchScript reads the attribute's type
    __annotations__ = {"_state": Optional[torch.Tensor]}  # noqa: UP045

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self._state = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        state = self._state
        if state is not None and state.shape == h.shape:
            h = h + state
        self._state = h.detach()
        return h


class Dropping(nn.Module):
    """Dropout left in training mode: eager disagrees with itself."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.lin(x))

    def eval(self) -> Dropping:  # the factory's model is put in eval mode: stay in training
        return self.train()


class SmallVocab(nn.Module):
    def __init__(self, vocab: int = 10) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.emb(ids)


def LargeVocab() -> nn.Module:
    return SmallVocab(100)


def mlp() -> nn.Module:
    """fixtures.models' MLP from a module without ``example_inputs``."""
    return MLP()


# --- helpers ----------------------------------------------------------------------------------


def _save(model: nn.Module, path: Path) -> Path:
    torch.save(model.state_dict(), path)
    return path


def _script(model: nn.Module, path: Path) -> Path:
    torch.jit.script(model).save(str(path))
    return path


def _export(model: nn.Module, args: tuple[Any, ...], path: Path, dynamic: bool = True) -> Path:
    batch = torch.export.Dim("batch", min=1, max=16)
    shapes = tuple({0: batch} for _ in args) if dynamic else None
    torch.export.save(torch.export.export(model, args, dynamic_shapes=shapes), path)
    return path


def _statuses(report: dict[str, Any]) -> list[tuple[int, str]]:
    return [(s["batch"], s["status"]) for s in report["parity"]["sizes"]]


# --- 1. inputs bound to the candidate's signature ---------------------------------------------


class IdsOnly(nn.Module):
    """BERT called with ``input_ids`` alone, its outputs as a dict (what the reference returns)."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.bert(input_ids=input_ids)
        return {"last_hidden_state": out.last_hidden_state, "pooler_output": out.pooler_output}


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny BERT directory, a correct export taking input_ids only, and a perturbed one."""
    transformers = pytest.importorskip("transformers")
    from fixtures.build import _tiny_bert_config

    out = tmp_path_factory.mktemp("bert")
    config = _tiny_bert_config()
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    model.save_pretrained(out / "bert")
    ids = (torch.randint(0, 99, (2, 16), generator=torch.Generator().manual_seed(0)),)
    good = _export(IdsOnly(model).eval(), ids, out / "good.pt2")
    wrong = copy.deepcopy(model)
    with torch.no_grad():
        wrong.encoder.layer[0].output.dense.weight[0, :4] += 0.5
    bad = _export(IdsOnly(wrong).eval(), ids, out / "bad.pt2")
    return {"dir": out / "bert", "good": good, "bad": bad}


def test_a_candidate_taking_input_ids_alone_is_fed_input_ids_alone(bert, capsys) -> None:
    code, report, _ = run_cli(["verify", str(bert["dir"]), str(bert["good"])], capsys)
    assert code == 0, report
    assert report["status"] == "pass"
    assert {1, 2, 3, 5, 7} <= set(report["batches"])
    assert all(status == "pass" for _, status in _statuses(report))
    assert report["inputs_fed"] == ["input_ids"]
    assert report["inputs_left_out"] == ["attention_mask", "token_type_ids"]
    assert not report["state"]["reference"]  # a BERT keeps no state between calls


def test_the_inputs_fed_are_rendered(bert, capsys) -> None:
    assert main(["verify", str(bert["dir"]), str(bert["good"])]) == 0
    out = capsys.readouterr().out
    assert "inputs fed to both: input_ids" in out and "attention_mask" in out


def test_a_wrong_candidate_taking_input_ids_alone_still_fails(bert, capsys) -> None:
    code, report, _ = run_cli(["verify", str(bert["dir"]), str(bert["bad"])], capsys)
    assert code == 6 and "fail_accuracy" in report["error"]["message"]


def test_every_runtime_names_the_inputs_it_accepts(tmp_path: Path) -> None:
    from ptconvert.options import Options
    from ptconvert.verify.runtime import open_runtime

    model = seeded(TwoInputs())
    args = (torch.randn(2, 8), torch.randn(2, 4))
    ts = open_runtime(_script(model, tmp_path / "m.ts"), Options())
    assert ts.input_names == ["x", "y"] and ts.signature and ts.signature.required == ["x", "y"]
    pt2 = open_runtime(_export(model, args, tmp_path / "m.pt2"), Options())
    assert pt2.input_names == ["x", "y"]
    eager = open_runtime(_save(model, tmp_path / "m.pt"), Options(model=f"{HERE}:TwoInputs"))
    assert eager.input_names == ["x", "y"]


# --- 2. mismatched names ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("two")
    model = seeded(TwoInputs())
    ab = TwoInputsAB()
    ab.load_state_dict(model.state_dict())
    args = (torch.randn(2, 8), torch.randn(2, 4))
    return {
        "weights": _save(model, out / "two.pt"),
        "ab_pt2": _export(ab.eval(), args, out / "ab.pt2"),
    }


def test_different_names_are_a_usage_error_naming_both_signatures(two_inputs, capsys) -> None:
    # the .pt2's own sample inputs (named a, b) are the example inputs; the reference takes x, y
    args = ["verify", str(two_inputs["weights"]), str(two_inputs["ab_pt2"])]
    code, report, _ = run_cli([*args, "--model", f"{HERE}:TwoInputs"], capsys)
    assert code == 2, report
    error = report["error"]
    assert error["kind"] == "usage"
    assert "(x, y)" in error["message"] and "(a, b)" in error["message"]
    assert "--input-map" in error["hint"] and "x=a" in error["hint"]


def test_input_map_feeds_reference_inputs_under_the_candidates_names(two_inputs, capsys) -> None:
    args = ["verify", str(two_inputs["weights"]), str(two_inputs["ab_pt2"])]
    args += ["--model", f"{HERE}:TwoInputs", "--input-map", "x=a", "--input-map", "y=b"]
    code, report, _ = run_cli(args, capsys)
    assert code == 0 and report["status"] == "pass", report
    assert report["inputs_fed"] == ["x", "y"]
    assert report["input_map"] == {"x": "a", "y": "b"}


def test_input_map_of_an_input_nobody_has_is_a_usage_error(two_inputs, capsys) -> None:
    args = ["verify", str(two_inputs["weights"]), str(two_inputs["ab_pt2"])]
    args += ["--model", f"{HERE}:TwoInputs", "--input-map", "x=zz", "--input-map", "y=b"]
    code, report, _ = run_cli(args, capsys)
    assert code == 2 and "'zz'" in report["error"]["message"]
    code, report, _ = run_cli([*args[:-4], "--input-map", "x"], capsys)
    assert code == 2 and "key=value" in report["error"]["message"]


def test_one_input_on_each_side_is_mapped_automatically(tmp_path: Path, capsys) -> None:
    # a .pt2 whose placeholder is `input` (its samples are the inputs) against forward(x)
    wrapped = TakesInput()
    wrapped.mlp.load_state_dict(seeded(MLP()).state_dict())
    program = _export(wrapped.eval(), (torch.randn(2, 8),), tmp_path / "input.pt2")
    weights = _save(seeded(MLP()), tmp_path / "mlp.pt")
    code, report, _ = run_cli(
        ["verify", str(weights), str(program), "--model", f"{HERE}:mlp"], capsys
    )
    assert code == 0 and report["status"] == "pass", report
    assert report["input_map"] == {"x": "input"} and report["inputs_fed"] == ["x"]
    assert report["batches"] == [1, 2, 3, 5, 7, 16]
    assert any("automatically" in note for note in report["notes"])


def test_torchscript_x_against_onnx_input(tmp_path: Path, capsys) -> None:
    if importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None:
        pytest.skip("needs onnx and onnxruntime")
    model = seeded(MLP())
    scripted = _script(model, tmp_path / "mlp.ts")
    program = torch.onnx.export(
        model,
        (torch.randn(2, 8),),
        dynamo=True,
        dynamic_shapes=({0: "batch"},),
        input_names=["input"],
        verbose=False,
    )
    assert program is not None
    program.save(str(tmp_path / "mlp.onnx"))
    import onnx

    # the candidate's input is named "input": only the automatic mapping makes x reach it
    assert [i.name for i in onnx.load(str(tmp_path / "mlp.onnx")).graph.input] == ["input"]
    args = ["verify", str(scripted), str(tmp_path / "mlp.onnx"), "--input", "x:2x8:float32"]
    code, report, _ = run_cli(args, capsys)
    assert code == 0 and report["status"] == "pass", report
    assert report["input_map"] == {"x": "input"}


# --- 3. stateful models -----------------------------------------------------------------------


@pytest.mark.parametrize(("factory", "changed"), [("Counter", "calls"), ("Recurrent", "_state")])
def test_a_stateful_model_is_compared_from_the_same_initial_state(
    factory: str, changed: str, tmp_path: Path, capsys
) -> None:
    model = seeded(globals()[factory]())
    weights = _save(model, tmp_path / "w.pt")
    scripted = _script(copy.deepcopy(model), tmp_path / "m.ts")
    args = ["verify", str(weights), str(scripted), "--model", f"{HERE}:{factory}"]
    code, report, _ = run_cli([*args, "--input", "x:2x8:float32"], capsys)
    assert code == 0 and report["status"] == "pass", report
    assert all(status == "pass" for _, status in _statuses(report))
    assert any(name.startswith(changed + " ") for name in report["state"]["reference"])
    assert any(name.startswith(changed + " ") for name in report["state"]["candidate"])
    assert "3 times in a row" in report["state"]["compared"]
    assert any(note.startswith("stateful model") for note in report["notes"])


def test_a_wrong_stateful_candidate_still_fails(tmp_path: Path, capsys) -> None:
    model = seeded(Counter())
    weights = _save(model, tmp_path / "w.pt")
    wrong = copy.deepcopy(model)
    with torch.no_grad():
        wrong.lin.bias += 0.1
    scripted = _script(wrong, tmp_path / "m.ts")
    args = ["verify", str(weights), str(scripted), "--model", f"{HERE}:Counter"]
    code, report, _ = run_cli([*args, "--input", "x:2x8:float32"], capsys)
    assert code == 6 and "fail_accuracy" in report["error"]["message"]


def test_a_candidate_that_drifts_where_the_reference_does_not_fails(tmp_path: Path, capsys) -> None:
    model = seeded(Counter())
    weights = _save(model, tmp_path / "w.pt")
    scripted = _script(model, tmp_path / "m.ts")
    args = ["verify", str(weights), str(scripted), "--model", f"{HERE}:Uncounted"]
    code, report, _ = run_cli([*args, "--input", "x:2x8:float32", "--warn-only"], capsys)
    assert code == 0 and report["status"] == "fail_accuracy"
    assert _statuses(report)[0] == (1, "pass")  # its first call agrees, the next ones do not
    assert report["state"]["reference"] == [] and report["state"]["candidate"]
    assert any("the candidate changes its state" in note for note in report["notes"])


def test_nothing_compared_is_never_a_pass(tmp_path: Path, capsys) -> None:
    model = seeded(Dropping())
    weights = _save(model, tmp_path / "w.pt")
    args = ["verify", str(weights), str(weights), "--model", f"{HERE}:Dropping"]
    args += ["--input", "x:2x8:float32", "--warn-only"]
    code, report, _ = run_cli(args, capsys)
    assert report["status"] == "eager_nondeterministic"
    assert report["parity"]["compared"] == 0
    assert any(note.startswith("nothing was compared") for note in report["notes"])
    code, report, _ = run_cli(args[:-1], capsys)
    assert code == 6 and "tolerances" not in report["error"]["hint"]


def test_compare_with_no_batch_size_is_not_a_pass() -> None:
    from ptconvert.verify.parity import compare

    model = seeded(MLP())
    report = compare(model, model, lambda b: {"x": torch.randn(b, 8)}, [])
    assert report.status == "nothing_compared" and report.compared == 0


# --- 4. --key and --keep-prefix ---------------------------------------------------------------


@pytest.fixture(scope="module")
def training(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from safetensors.torch import save_file

    out = tmp_path_factory.mktemp("training")
    model = seeded(MLP())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save({"model_state": sd, "optimizer_state": opt.state_dict(), "epoch": 3}, out / "t.ckpt")
    save_file(sd, out / "w.safetensors")
    prefixed = {f"_orig_mod.{k}": v for k, v in sd.items()}
    torch.save(prefixed, out / "prefixed.pt")
    save_file(prefixed, out / "prefixed.safetensors")
    return {
        "ckpt": out / "t.ckpt",
        "weights": out / "w.safetensors",
        "prefixed": out / "prefixed.pt",
        "prefixed_st": out / "prefixed.safetensors",
    }


def test_verify_key_takes_the_model_entry(training, capsys) -> None:
    args = ["verify", str(training["ckpt"]), str(training["weights"])]
    code, report, _ = run_cli([*args, "--key", "model_state"], capsys)
    assert code == 0 and report["kind"] == "weights" and report["status"] == "pass", report
    assert report["weights"]["tensors"] == 4
    # without --key the optimizer state is recognised and the model's entry taken
    code, report, _ = run_cli(args, capsys)
    assert code == 0 and report["status"] == "pass", report
    code, report, _ = run_cli([*args, "--key", "nope"], capsys)
    assert code == 4 and "'nope'" in report["error"]["message"]


def test_verify_strips_a_prefix_as_the_conversion_does(training, capsys) -> None:
    code, report, _ = run_cli(
        ["verify", str(training["prefixed"]), str(training["weights"])], capsys
    )
    assert code == 0 and report["status"] == "pass", report
    args = ["verify", str(training["prefixed"]), str(training["prefixed_st"])]
    code, report, _ = run_cli(args, capsys)
    assert code == 6  # the reference's prefix was stripped, the candidate kept it
    code, report, _ = run_cli([*args, "--keep-prefix"], capsys)
    assert code == 0 and report["status"] == "pass", report


# --- 5. the model's own errors ----------------------------------------------------------------


def test_a_reference_that_raises_is_a_model_error(tmp_path: Path, capsys) -> None:
    model = seeded(SmallVocab())
    weights = _save(model, tmp_path / "w.pt")
    scripted = _script(model, tmp_path / "m.ts")
    args = ["verify", str(weights), str(scripted), "--model", f"{HERE}:SmallVocab"]
    code, report, _ = run_cli([*args, "--input", "ids:2x16:int64"], capsys)
    assert code == 4, report
    error = report["error"]
    assert error["kind"] == "model_error" and error["type"] == "ModelRaisedError"
    assert error["message"].startswith("the reference model raised IndexError")
    assert "ids int64[" in error["message"] and error["path"] == str(weights)
    assert "NAME:SHAPE:DTYPE:LOW:HIGH" in error["hint"]


def test_a_candidate_that_raises_stays_fail_to_run(tmp_path: Path, capsys) -> None:
    reference = seeded(LargeVocab())
    weights = _save(reference, tmp_path / "w.pt")
    scripted = _script(seeded(SmallVocab()), tmp_path / "m.ts")
    args = ["verify", str(weights), str(scripted), "--model", f"{HERE}:LargeVocab"]
    code, report, _ = run_cli([*args, "--input", "ids:2x16:int64", "--warn-only"], capsys)
    assert code == 0 and report["status"] == "fail_to_run"  # a finding, not the model's error
    assert all(status == "fail_to_run" for _, status in _statuses(report))
    assert any(
        note == "nothing was compared: the candidate failed to run" for note in report["notes"]
    )


def test_run_model() -> None:
    from ptconvert.errors import ModelRaisedError, UnsupportedConversionError
    from ptconvert.verify.parity import describe_inputs, run_model

    ids = torch.arange(32).reshape(2, 16) % 100
    ids[1, 3] = 99
    assert describe_inputs({"ids": ids}) == "ids int64[2,16] in [0, 99]"
    assert run_model(lambda ids: ids.sum(), {"ids": ids}, "the candidate") == ids.sum()

    def fails(ids: torch.Tensor) -> None:
        raise IndexError("index out of range in self\nmore detail")

    with pytest.raises(ModelRaisedError) as info:
        run_model(fails, {"ids": ids}, "the candidate")
    err = info.value
    assert isinstance(err, UnsupportedConversionError) and err.exit_code == 4
    assert err.kind == "model_error"
    assert err.message == (
        "the candidate raised IndexError on the example inputs: index out of range in self "
        "(inputs: ids int64[2,16] in [0, 99])"
    )
    assert err.hint is not None and "--input NAME:SHAPE:DTYPE:LOW:HIGH" in err.hint


def _runtime(names: list[str], required: list[str] | None = None, any_name: bool = False) -> Any:
    from ptconvert.verify.runtime import Runtime, Signature

    signature = Signature(names, names if required is None else required, any_name)
    return Runtime(Path("model"), "torchscript", None, signature=signature)


def test_bind_inputs() -> None:
    from ptconvert.errors import UsageError
    from ptconvert.verify.check import bind_inputs

    # TorchScript's debug names: a converted program's x_1 is the source's x
    binding = bind_inputs(["x", "y"], _runtime(["x", "y"]), _runtime(["x_1", "y_1"]))
    assert binding.renamed == {"x": "x_1", "y": "y_1"} and binding.notes
    # optional inputs the examples do not have are not needed; extra examples are left out
    binding = bind_inputs(
        ["input_ids", "attention_mask"],
        _runtime(["input_ids", "attention_mask"], [], any_name=True),
        _runtime(["input_ids", "token_type_ids"], ["input_ids"]),
    )
    assert [r for _, r, _ in binding.fed] == ["input_ids"]
    assert binding.left_out == ["attention_mask"]
    # the reference needs an input the candidate does not take: they compute different things
    with pytest.raises(UsageError, match="the reference needs 'mask'"):
        bind_inputs(["x", "mask"], _runtime(["x", "mask"]), _runtime(["x"]))
    with pytest.raises(UsageError, match="the candidate takes no input 'z'"):
        bind_inputs(["x"], _runtime(["x"]), _runtime(["input"]), {"x": "z"})


def test_the_input_map_hint_pairs_inputs_of_the_same_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """silero-vad: its ONNX takes (input, state, sr) and its TorchScript (x, sr); paired by
    position the hint said ``--input-map sr=state``, the sample rate (an int) fed to the RNN
    state (a float tensor of rank 3). Each pair's kinds agree: the audio with the audio, the
    rate with the int64 scalar."""
    import onnx
    import torch
    from onnx import TensorProto, helper

    from tests.conftest import run_cli

    inputs = [
        helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 512]),
        helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, 1, 128]),
        helper.make_tensor_value_info("sr", TensorProto.INT64, []),
    ]
    outputs = [
        helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 512]),
        helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, 1, 128]),
    ]
    nodes = [
        helper.make_node("Cast", ["sr"], ["rate"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["input", "rate"], ["output"]),
        helper.make_node("Identity", ["state"], ["stateN"]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "vad", inputs, outputs),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "vad.onnx"))

    class Vad(torch.nn.Module):
        def forward(self, audio: torch.Tensor, rate: int) -> torch.Tensor:
            return audio * rate

    torch.jit.save(torch.jit.script(Vad()), str(tmp_path / "vad.ts"))
    given = ["input:1x512:float32", "state:2x1x128:float32", "sr::int64=16000"]
    code, report, _ = run_cli(
        ["verify", str(tmp_path / "vad.ts"), str(tmp_path / "vad.onnx")]
        + [a for i in given for a in ("--input", i)],
        capsys,
    )
    assert code == 2, report
    hint = report["error"]["hint"]
    assert "--input-map audio=input rate=sr " in hint, hint


def test_inputs_named_alike_pair_with_each_other_in_the_hint() -> None:
    """silero-vad's own names: the TorchScript's (x, sr), the ONNX's (input, state, sr)."""
    from ptconvert.verify.input_pairs import suggested_pairs

    assert suggested_pairs(["x", "sr"], ["input", "state", "sr"], {}, {}) == ["x=input"]
    kinds = {"input": ("tensor", 2), "state": ("tensor", 3), "sr": ("int", 0)}
    assert suggested_pairs(["rate", "x"], ["input", "state", "sr"], {"rate": "int"}, kinds) == [
        "rate=sr",
        "x=input",
    ]
