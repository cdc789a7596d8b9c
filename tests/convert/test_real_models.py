"""What users bring: Hugging Face directories as they are, programs other tools wrote, models
that branch on sizes, need scalars or raise on bad inputs. Every model is built in the test
(tiny config, random weights) and every artifact is read back by the format's own loader."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from fixtures.build import _more_hf_models, _tiny_bert_config, _tiny_gpt2_config
from ptconvert.convert.engine import convert_program
from ptconvert.errors import MissingRequirementError, ModelRaisedError, UnsupportedConversionError
from ptconvert.options import Options
from tests.conftest import run_cli, swap_step

transformers = pytest.importorskip("transformers")


def _without_architectures(directory: Path) -> Path:
    config = json.loads((directory / "config.json").read_text())
    config.pop("architectures", None)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def gpt2_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An older GPT-2 directory: config.json without architectures, a pytorch_model.bin that
    holds lm_head.weight (tied to the embeddings) beside the transformer's weights."""
    directory = tmp_path_factory.mktemp("gpt2-bin")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(_tiny_gpt2_config()).eval()
    model.config.save_pretrained(directory)
    torch.save(model.state_dict(), directory / "pytorch_model.bin")
    return _without_architectures(directory)


def test_directory_without_architectures_takes_the_class_its_weights_fit(
    gpt2_bin: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    report = convert_program(gpt2_bin, "pt2", tmp_path / "g.pt2", Options(dynamic_batch=True))
    # transformers' own "Loading weights" bar is not shown beside ptconvert's progress
    assert "Loading weights" not in capfd.readouterr().err
    assert transformers.utils.logging.is_progress_bar_enabled()  # and is on again after
    assert report.parity is not None and report.parity.status == "pass"
    assert any("chose GPT2LMHeadModel" in n for n in report.notes)
    # GPT-2's forward has past_key_values between input_ids and attention_mask: by keyword
    assert report.interface["call"] == "prog(input_ids=…, attention_mask=…)"
    program = torch.export.load(tmp_path / "g.pt2").module()
    ids = torch.randint(0, 99, (3, 16))
    out = program(input_ids=ids, attention_mask=torch.ones_like(ids))
    assert out["logits"].shape == (3, 16, 99)


def test_task_overrides_and_unused_weights_are_reported_not_refused(
    gpt2_bin: Path, tmp_path: Path
) -> None:
    report = convert_program(gpt2_bin, "pt2", tmp_path / "g.pt2", Options(task="GPT2Model"))
    assert report.parity is not None and report.parity.status == "pass"
    assert any("lm_head.weight" in n and "not used by GPT2Model" in n for n in report.notes)


def test_missing_weights_stay_an_error(tmp_path: Path) -> None:
    directory = tmp_path / "bert"
    transformers.BertModel(_tiny_bert_config()).save_pretrained(directory)
    with pytest.raises(UnsupportedConversionError, match="missing"):
        convert_program(
            directory, "pt2", tmp_path / "b.pt2", Options(task="BertForSequenceClassification")
        )


def test_pretraining_checkpoint_into_a_masked_lm(tmp_path: Path) -> None:
    """transformers loads a BertForPreTraining checkpoint into BertForMaskedLM, the
    next-sentence head left over: so does ptconvert, and says which keys it left out."""
    directory = tmp_path / "bert-pretraining"
    transformers.BertForPreTraining(_tiny_bert_config()).save_pretrained(directory)
    _without_architectures(directory)
    report = convert_program(
        directory, "torchscript", tmp_path / "b.ts", Options(task="BertForMaskedLM")
    )
    assert report.parity is not None and report.parity.status == "pass"
    assert any("cls.seq_relationship.weight" in n for n in report.notes)


# the class choice is the same for either target: TorchScript (the cheaper) runs by default
@pytest.mark.parametrize("target", [pytest.param("pt2", marks=pytest.mark.slow), "torchscript"])
def test_t5_directory_without_architectures(target: str, tmp_path: Path) -> None:
    config, cls = _more_hf_models()["t5"]
    directory = tmp_path / "t5"
    torch.manual_seed(0)
    cls(config).eval().save_pretrained(directory)
    _without_architectures(directory)
    report = convert_program(
        directory, target, tmp_path / f"t5.{target}", Options(dynamic_batch=target == "pt2")
    )
    assert report.parity is not None and report.parity.status == "pass"
    assert any("chose T5ForConditionalGeneration" in n for n in report.notes)
    assert "logits" in report.interface["outputs"][0]


def test_torchscript_keeps_the_models_input_and_output_names(
    samples: dict[str, Path], tmp_path: Path
) -> None:
    convert_program(samples["hf_bert"], "torchscript", tmp_path / "b.ts", Options())
    program = torch.jit.load(str(tmp_path / "b.ts"))
    names = [a.name for a in program.forward.schema.arguments[1:]]
    assert names == ["input_ids", "attention_mask", "token_type_ids"]
    ids = torch.randint(0, 99, (2, 16))
    # the model's keywords
    out = program(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=ids % 2)
    assert set(out) == {"last_hidden_state", "pooler_output"}


def test_hand_exported_transformers_program_converts_to_safetensors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A .pt2 exported by torch.export directly: its output spec names a ModelOutput class."""
    model = transformers.BertModel(_tiny_bert_config()).eval()
    ids = torch.randint(0, 99, (2, 16))
    ep = torch.export.export(model, (), {"input_ids": ids}, strict=False)
    torch.export.save(ep, tmp_path / "hand.pt2")
    code, report, _ = run_cli(
        [str(tmp_path / "hand.pt2"), "--to", "safetensors", "-o", str(tmp_path / "w.st")], capsys
    )
    assert code == 0, report["error"]
    with safe_open(tmp_path / "w.st", "pt") as f:
        got = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    own = model.state_dict()
    assert got and all(torch.equal(got[k], own[k]) for k in got)
    code, report, _ = run_cli(
        [str(tmp_path / "hand.pt2"), "--to", "pt2", "-o", str(tmp_path / "copy.pt2")], capsys
    )
    assert code == 0, report


def test_program_of_unknown_python_types_is_refused_by_name(tmp_path: Path) -> None:
    from ptconvert.formats.pt2 import load_exported

    model = transformers.BertModel(_tiny_bert_config()).eval()
    ep = torch.export.export(model, (), {"input_ids": torch.randint(0, 99, (2, 8))})
    torch.export.save(ep, tmp_path / "p.pt2")
    raw = (
        (tmp_path / "p.pt2")
        .read_bytes()
        .replace(b"transformers.modeling_outputs", b"evilpkgxxxxx.modeling_outputs")
    )
    (tmp_path / "q.pt2").write_bytes(raw)
    with pytest.raises(UnsupportedConversionError, match="evilpkgxxxxx"):
        load_exported(tmp_path / "q.pt2")
    assert "evilpkgxxxxx" not in sys.modules


@pytest.mark.parametrize("fmt", ["torchscript", "pt2"])
def test_same_format_is_a_verified_copy(
    samples: dict[str, Path], fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = samples["mlp_scripted" if fmt == "torchscript" else "mlp_pt2"]
    out = tmp_path / f"copy.{fmt}"
    code, report, _ = run_cli([str(src), "--to", fmt, "-o", str(out)], capsys)
    assert code == 0, report
    assert out.read_bytes() == src.read_bytes()
    assert report["route"] == [f"{fmt} → {fmt}"]
    loaded = torch.jit.load(str(out)) if fmt == "torchscript" else torch.export.load(out).module()
    assert loaded(torch.randn(2, 8)).shape == (2, 4)


def test_static_program_says_which_shapes_it_accepts(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [str(samples["mlp_zip"]), "--to", "pt2", "--model", "fixtures.models:MLP"]
    code, report, _ = run_cli(
        [*args, "--input", "x:4x8:float32", "-o", str(tmp_path / "s.pt2")], capsys
    )
    assert code == 0, report
    assert report["interface"]["call"] == "prog(x)"
    assert "--dynamic-batch" in report["interface"]["accepts"][0]
    with pytest.raises(AssertionError, match=r"Guard failed: x\.size\(\)\[0\] == 4"):
        torch.export.load(tmp_path / "s.pt2").module()(torch.randn(3, 8))  # as it said
    code, report, _ = run_cli(
        [*args, "--input", "x:4x8:float32", "--dynamic-batch", "-o", str(tmp_path / "d.pt2")],
        capsys,
    )
    assert code == 0 and not any("--dynamic-batch" in a for a in report["interface"]["accepts"])


MODELS = '''
import torch
from torch import nn


class Lookup(nn.Module):
    """Takes label ids: ids past 10 are outside its table."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(10, 4)

    def forward(self, ids):
        return self.table(ids).sum(1)


class WithRate(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, sr: int):
        return self.lin(x) * (sr / 16000)


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)

    def forward(self, x):
        if x.shape[0] > 2:  # a Python branch on the batch size
            return self.a(x)
        return self.b(x) * 2
'''


@pytest.fixture
def user_models(tmp_path: Path) -> Path:
    (tmp_path / "user_models.py").write_text(MODELS)
    return tmp_path / "user_models.py"


def _weights(user_models: Path, name: str, tmp_path: Path) -> Path:
    import importlib.util

    spec = importlib.util.spec_from_file_location("user_models_for_weights", user_models)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    path = tmp_path / f"{name}.pt"
    torch.save(getattr(module, name)().state_dict(), path)
    return path


def test_the_models_own_error_is_reported_as_such(
    user_models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _weights(user_models, "Lookup", tmp_path)
    args = [
        str(src),
        "--to",
        "pt2",
        "--model",
        f"{user_models}:Lookup",
        "-o",
        str(tmp_path / "l.pt2"),
    ]
    code, report, _ = run_cli([*args, "--input", "ids:2x5:int64"], capsys)
    assert code == ModelRaisedError.exit_code, report
    assert report["error"]["kind"] == "model_error" and "IndexError" in report["error"]["message"]
    code, report, _ = run_cli([*args, "--input", "ids:2x5:int64:0:10"], capsys)
    assert code == 0, report


FACTORY_WITH_MODULE_TENSORS = """
import torch
from torch import nn

MEAN = torch.full((8,), 0.5)  # a module constant, as normalisation statistics are kept


class Normalized(nn.Module):
    def __init__(self, scale=torch.ones(8)):  # a default argument tensor
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("scale", scale.clone())

    def forward(self, x):
        return self.lin((x - MEAN) * self.scale)


def example_inputs(batch_size):
    return {"x": torch.randn(batch_size, 8)}
"""


def test_a_factory_files_module_tensors_are_real_tensors(tmp_path: Path) -> None:
    """The factory's file is imported as usual; only the model is built on the meta device
    (its module-level tensors became meta tensors, and the conversion failed)."""
    factory = tmp_path / "normalized.py"
    factory.write_text(FACTORY_WITH_MODULE_TENSORS)
    spec = importlib.util.spec_from_file_location("normalized_for_weights", factory)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.save(module.Normalized().state_dict(), tmp_path / "w.pt")
    opts = Options(model=f"{factory}:Normalized")
    report = convert_program(tmp_path / "w.pt", "pt2", tmp_path / "n.pt2", opts)
    assert report.parity is not None and report.parity.status == "pass"
    assert any("meta device" in n for n in report.notes), report.notes


TUPLE_EXAMPLES = """
import torch


class Pair(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x, y):
        return self.lin(x) + y


def make():
    torch.manual_seed(0)
    return Pair()


def example_inputs(batch_size):
    return (torch.randn(batch_size, 8), torch.randn(batch_size, 4))  # torch.export's habit
"""


def test_example_inputs_may_be_a_tuple_and_errors_never_print_tensors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A module's example_inputs returning a tuple failed with an error printing a whole
    tensor; it is positional now, named after forward's parameters."""
    factory = tmp_path / "pair.py"
    factory.write_text(TUPLE_EXAMPLES)
    linear = torch.nn.Linear(8, 4).state_dict()
    torch.save({f"lin.{k}": v for k, v in linear.items()}, tmp_path / "w.pt")
    out = tmp_path / "p.pt2"
    args = [str(tmp_path / "w.pt"), "--to", "pt2", "--model", f"{factory}:make", "-o", str(out)]
    code, report, _ = run_cli([*args, "--no-cache"], capsys)
    assert code == 0, report
    program = torch.export.load(out).module()
    assert program(torch.randn(2, 8), torch.randn(2, 4)).shape == (2, 4)
    factory.write_text(
        TUPLE_EXAMPLES.replace(
            "torch.randn(batch_size, 4))", "torch.randn(batch_size, 4), torch.ones(3, 3))"
        )
    )
    code, report, _ = run_cli([*args, "--no-cache", "--force"], capsys)
    assert code == 2, report
    message = report["error"]["message"]
    assert "returned 3 positional inputs (float32[2, 8], float32[2, 4], float32[3, 3])" in message
    assert "tensor(" not in message


def test_a_missing_scalar_input_is_named_with_its_input_line(
    user_models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _weights(user_models, "WithRate", tmp_path)
    args = [str(src), "--to", "torchscript", "--model", f"{user_models}:WithRate"]
    args += ["--input", "x:2x8:float32", "-o", str(tmp_path / "w.ts")]
    code, report, _ = run_cli(args, capsys)
    assert code == MissingRequirementError.exit_code, report
    assert "--input sr::int64=VALUE" in report["error"]["hint"]
    code, report, _ = run_cli([*args, "--input", "sr::int64=16000"], capsys)
    assert code == 0, report
    program = torch.jit.load(str(tmp_path / "w.ts"))
    assert program(torch.randn(2, 8), 16000).shape == (2, 8)


def test_a_torchscript_archive_missing_its_scalar_input_is_named_with_its_input_line(
    user_models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A scripted model taking a tensor and an int (silero-vad's ``forward(x, sr: int)``) to
    pt2 with only ``x`` given: the missing ``sr`` is named, not a KeyError."""
    src = _weights(user_models, "WithRate", tmp_path)
    code, report, _ = run_cli(
        [
            str(src),
            "--to",
            "torchscript",
            "--model",
            f"{user_models}:WithRate",
            "--input",
            "x:2x8:float32",
            "--input",
            "sr::int64=16000",
            "-o",
            str(tmp_path / "vad.jit"),
        ],
        capsys,
    )
    assert code == 0, report
    args = [str(tmp_path / "vad.jit"), "--to", "pt2", "-o", str(tmp_path / "vad.pt2")]
    code, report, _ = run_cli([*args, "--input", "x:2x8:float32"], capsys)
    assert code == MissingRequirementError.exit_code, report
    assert "'sr'" in report["error"]["message"], report
    assert "--input sr::int64=VALUE" in report["error"]["hint"]


def test_a_branch_on_the_batch_size_is_kept_by_the_torchscript_route(
    user_models: Path, tmp_path: Path
) -> None:
    src = _weights(user_models, "Branchy", tmp_path)
    opts = Options(model=f"{user_models}:Branchy", inputs=["x:4x6:float32"])
    report = convert_program(src, "torchscript", tmp_path / "b.ts", opts)
    assert report.parity is not None and report.parity.status == "pass"
    program = torch.jit.load(str(tmp_path / "b.ts"))
    x = torch.randn(1, 6)
    torch.testing.assert_close(program(x), program.b(x) * 2)


def test_non_strict_leaves_out_training_keys_and_says_so(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fixtures.models import MLP, seeded

    state = seeded(MLP()).state_dict()
    torch.save({**state, "ema.decay": torch.tensor(0.99)}, tmp_path / "train.pt")
    args = [str(tmp_path / "train.pt"), "--to", "pt2", "--model", "fixtures.models:MLP"]
    args += ["--input", "x:2x8:float32", "-o", str(tmp_path / "m.pt2")]
    code, report, _ = run_cli(args, capsys)
    assert (
        code == UnsupportedConversionError.exit_code and "ema.decay" in report["error"]["message"]
    )
    assert "--non-strict" in report["error"]["hint"]
    code, report, _ = run_cli([*args, "--non-strict"], capsys)
    assert code == 0, report
    assert any("ema.decay" in n for n in report["notes"])


PREDICTOR = '''
import torch
from tests.convert.test_inputs import sam2


class Predictor:
    """Not an nn.Module: holds the model, as SAM2's image predictor does."""

    def __init__(self):
        torch.manual_seed(1)  # weights unlike the checkpoint's: the checkpoint must load
        self.model = sam2().eval()

    def embed(self, pixel_values):
        return self.model.get_image_embeddings(pixel_values)


def predictor_method():
    return Predictor().embed


def module_method():
    torch.manual_seed(1)
    return sam2().eval().get_image_embeddings
'''


# slow: test_a_method_factory_with_the_models_own_checkpoint runs both factories on an MLP
@pytest.mark.slow
@pytest.mark.parametrize("factory", ["predictor_method", "module_method"])
def test_sam2_method_with_the_users_own_checkpoint(
    factory: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.convert.test_inputs import sam2

    if not hasattr(transformers, "Sam2Model"):
        pytest.skip("this transformers has no Sam2Model")
    (tmp_path / "sam2_predictor.py").write_text(PREDICTOR)
    torch.manual_seed(0)
    model = sam2().eval()
    torch.save(model.state_dict(), tmp_path / "sam2.pt")  # the model's own keys
    out = tmp_path / "embed.pt2"
    code, report, _ = run_cli(
        [
            str(tmp_path / "sam2.pt"),
            "--to",
            "pt2",
            "--dynamic-batch",
            "--model",
            f"{tmp_path / 'sam2_predictor.py'}:{factory}",
            "--input",
            "pixel_values:1x3x64x64:float32",
            "-o",
            str(out),
        ],
        capsys,
    )
    assert code == 0, report
    if factory == "predictor_method":
        assert any("Predictor.model (Sam2Model)" in n for n in report["notes"]), report["notes"]
    x = torch.randn(2, 3, 64, 64)
    got = torch.export.load(out).module()(x)
    want = model.get_image_embeddings(x)
    torch.testing.assert_close(got, want)


HELD_MLP = """
import torch
from fixtures.models import MLP, seeded


class Predictor:
    \"\"\"Not an nn.Module: holds the model, as SAM2's image predictor does.\"\"\"

    def __init__(self):
        self.model = seeded(MLP(), seed=1)  # weights unlike the checkpoint's: it must load

    def scores(self, x):
        return self.model(x).softmax(-1)


class Scoring(MLP):
    def scores(self, x):
        return self(x).softmax(-1)


def predictor_method():
    return Predictor().scores


def module_method():
    return seeded(Scoring(), seed=1).scores
"""


@pytest.mark.parametrize("factory", ["predictor_method", "module_method"])
def test_a_method_factory_with_the_models_own_checkpoint(
    factory: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """test_sam2_method_with_the_users_own_checkpoint on an MLP: a checkpoint with the model's
    own keys loads into the module a predictor holds, or into the module whose method it is."""
    from fixtures.models import MLP, seeded

    (tmp_path / "held_mlp.py").write_text(HELD_MLP)
    model = seeded(MLP(), seed=5)
    torch.save(model.state_dict(), tmp_path / "mlp.pt")  # the model's own keys
    out = tmp_path / "scores.pt2"
    args = [str(tmp_path / "mlp.pt"), "--to", "pt2", "--dynamic-batch", "-o", str(out)]
    args += ["--model", f"{tmp_path / 'held_mlp.py'}:{factory}", "--input", "x:2x8:float32"]
    code, report, _ = run_cli(args, capsys)
    assert code == 0, report
    assert report["parity"]["status"] == "pass"
    if factory == "predictor_method":
        assert any("Predictor.model (MLP)" in n for n in report["notes"]), report["notes"]
    x = torch.randn(3, 8)
    torch.testing.assert_close(torch.export.load(out).module()(x), model(x).softmax(-1))


def test_a_branch_on_the_batch_size_narrows_the_exported_range_and_says_so(
    user_models: Path, tmp_path: Path
) -> None:
    """Export keeps the branch the example took and guards it (batch ≥ 3): the report says
    which batch sizes the program takes, and only those are compared."""
    src = _weights(user_models, "Branchy", tmp_path)
    opts = Options(model=f"{user_models}:Branchy", inputs=["x:4x6:float32"], dynamic_batch=True)
    report = convert_program(src, "pt2", tmp_path / "b.pt2", opts)
    assert report.parity is not None and report.parity.status == "pass"
    assert report.dynamic_range["x dim 0"].startswith("batch 3 or more"), report.dynamic_range
    assert [s.batch for s in report.parity.sizes] == [3, 5, 7]
    program = torch.export.load(tmp_path / "b.pt2").module()
    with pytest.raises(AssertionError, match=r"Guard failed: x\.size\(\)\[0\] >= 3"):
        program(torch.randn(2, 6))


def _wrong_program(step):  # type: ignore[no-untyped-def]
    """``step``, then its program swapped for one that runs but has other weights."""
    from fixtures.models import MLP, seeded

    def run(state, opts) -> None:  # type: ignore[no-untyped-def]
        step(state, opts)
        other = seeded(MLP(), seed=9)
        state.exported = torch.export.export(other, (torch.randn(2, 8),))

    return run


def test_a_program_that_fails_the_parity_check_sends_the_graph_down_another_route(
    samples: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exported program that runs but computes something else is not written: the graph
    tries the next route (script → TorchScript's converter) and says why."""
    swap_step(monkeypatch, "export", _wrong_program)
    opts = Options(model="fixtures.models:MLP", inputs=["x:2x8:float32"])
    report = convert_program(samples["mlp_zip"], "pt2", tmp_path / "m.pt2", opts)
    assert report.parity is not None and report.parity.status == "pass"
    assert "module → torchscript" in report.route and "torchscript → exported" in report.route
    assert any("failed the parity check" in n for n in report.notes)


def test_when_every_route_fails_the_parity_check_the_error_names_each(
    samples: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ptconvert.errors import VerificationError

    for name in ("export", "ts_to_exported"):
        swap_step(monkeypatch, name, _wrong_program)
    opts = Options(model="fixtures.models:MLP", inputs=["x:2x8:float32"])
    with pytest.raises(VerificationError, match=r"tried: export: .*script"):
        convert_program(samples["mlp_zip"], "pt2", tmp_path / "m.pt2", opts)
    assert not (tmp_path / "m.pt2").exists()


def test_scripting_errors_say_what_did_not_match() -> None:
    from ptconvert.formats.torchscript.edges.script import script_reason

    text = (
        "Arguments for call are not valid.\n"
        "The following variants are available:\n\n"
        '  aten::pad(Tensor self, SymInt[] pad, str mode="constant", float? value=None) -> '
        "Tensor:\n"
        "  Expected a value of type 'List[int]' for argument 'pad' but instead found type "
        "'Tensor (inferred)'.\n"
    )
    assert script_reason(RuntimeError(text)).startswith("Expected a value of type 'List[int]'")


# BLIP's inputs are checked by default in tests/convert/test_inputs.py (the model runs on them)
@pytest.mark.parametrize("kind", ["wav2vec2", pytest.param("blip", marks=pytest.mark.slow)])
def test_audio_and_image_text_directories_convert_without_inputs(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Wav2Vec2 directory (waveform input) and a BLIP one (image size in vision_config):
    the inputs come from the model, no --input needed."""
    from tests.convert.test_inputs import blip, wav2vec2

    torch.manual_seed(0)
    model = {"wav2vec2": wav2vec2, "blip": blip}[kind]().eval()
    model.save_pretrained(tmp_path / kind)
    out = tmp_path / f"{kind}.pt2"
    code, report, _ = run_cli(
        [str(tmp_path / kind), "--to", "pt2", "--dynamic-batch", "-o", str(out)], capsys
    )
    assert code == 0, report
    assert [s["batch"] for s in report["parity"]["sizes"]] == [1, 2, 3, 5, 7]
    code, info, _ = run_cli(["info", str(out)], capsys)
    assert code == 0 and info["metadata"]["call"].startswith("prog(")


@pytest.mark.parametrize("kind", ["vit", "distilbert"])
def test_the_class_is_chosen_by_shapes_where_transformers_renames_keys(
    kind: str, tmp_path: Path
) -> None:
    """transformers 5 renames ViT's keys as it loads, and a classifier head of 2 labels has the
    names of a multiple-choice head of 1: names alone choose wrong, names and shapes do not."""
    torch.manual_seed(0)
    if kind == "vit":
        config, _ = _more_hf_models()["vit"]
        model = transformers.ViTForImageClassification(config)
        want = "ViTForImageClassification"
    else:
        config = transformers.DistilBertConfig(
            vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37, num_labels=2
        )
        model = transformers.DistilBertForSequenceClassification(config)
        want = "DistilBertForSequenceClassification"
    model.eval().save_pretrained(tmp_path / kind)
    _without_architectures(tmp_path / kind)
    report = convert_program(tmp_path / kind, "torchscript", tmp_path / f"{kind}.ts", Options())
    assert any(f"chose {want}" in n for n in report.notes), report.notes
    assert report.parity is not None and report.parity.status == "pass"
    assert report.interface["outputs"] == ["logits"]


STATEFUL = '''
import torch
from torch import nn


class Counter(nn.Module):
    """Keeps a running sum of what it saw: every call changes its buffers."""

    def __init__(self, step: float = 1.0):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.step = step
        self.register_buffer("count", torch.zeros(()))
        self.register_buffer("acc", torch.zeros(4))

    def forward(self, x):
        out = self.lin(x) + self.acc * self.count  # the state the earlier calls left
        self.count += self.step
        self.acc += x.sum(0)
        return out


def counter():
    return Counter()


def wrong_counter():
    return Counter(step=5.0)
'''


def test_a_stateful_model_converts_and_a_wrong_state_update_is_caught(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "counter.py").write_text(STATEFUL)
    import importlib.util

    spec = importlib.util.spec_from_file_location("counter_for_test", tmp_path / "counter.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    torch.save(module.counter().state_dict(), tmp_path / "c.pt")
    args = [str(tmp_path / "c.pt"), "--model", f"{tmp_path / 'counter.py'}:counter"]
    args += ["--input", "x:2x4:float32"]
    code, report, _ = run_cli([*args, "--to", "torchscript", "-o", str(tmp_path / "c.ts")], capsys)
    assert code == 0, report
    assert any("stateful model" in n and "count (buffer)" in n for n in report["notes"])
    # a program whose state update is wrong agrees on the first call only: verify sees it
    torch.manual_seed(0)  # the same weights, another state update
    torch.jit.script(module.wrong_counter()).save(str(tmp_path / "wrong.ts"))
    wrong_args = ["verify", str(tmp_path / "c.pt"), str(tmp_path / "wrong.ts"), *args[1:]]
    code, report, _ = run_cli(wrong_args, capsys)
    assert code == 6 and "['call 2']" in report["error"]["message"], report


@pytest.mark.parametrize(
    "dynamic, says",
    [
        ("foo:0", "known input"),
        ("x", "not NAME:AXIS[:MIN:MAX]"),
        ("x:5", "has 2 dims"),
        ("x:1:9:3", "MIN is larger"),
        ("x:1:2:4", "outside 2–4"),
    ],
)
def test_a_wrong_dynamic_option_is_a_usage_error_not_another_route(
    samples: dict[str, Path], dynamic: str, says: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    args = [str(samples["mlp_zip"]), "--to", "pt2", "--model", "fixtures.models:MLP"]
    args += ["--input", "x:2x8:float32", "--dynamic", dynamic, "-o", str(tmp_path / "m.pt2")]
    code, report, _ = run_cli(args, capsys)
    assert code == 2 and says in report["error"]["message"], report
    assert not (tmp_path / "m.pt2").exists()


def test_a_model_arg_the_factory_does_not_take_is_a_usage_error(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [str(samples["mlp_zip"]), "--to", "pt2", "--model", "fixtures.models:MLP"]
    args += ["--model-arg", "k=1", "--input", "x:2x8:float32", "-o", str(tmp_path / "m.pt2")]
    code, report, _ = run_cli(args, capsys)
    assert code == 2 and "d_in" in report["error"]["hint"], report


def test_a_copy_cannot_make_a_program_dynamic(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [str(samples["mlp_pt2"]), "--to", "pt2", "--dynamic-batch"]
    code, report, _ = run_cli([*args, "-o", str(tmp_path / "c.pt2")], capsys)
    assert code == 2 and "a copy cannot apply --dynamic-batch" in report["error"]["message"]
    code, plan, _ = run_cli(["plan", str(samples["mlp_scripted"]), "--to", "torchscript"], capsys)
    assert code == 0 and [s["step"] for s in plan["steps"]] == ["copy"]


def test_verify_feeds_a_static_program_the_shapes_it_was_exported_at(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A .pt2 someone exported at [2, 12] (its outputs a ModelOutput): verify against the
    directory uses the program's own sample inputs, not the directory's derived length."""
    torch.manual_seed(0)
    model = transformers.BertModel(_tiny_bert_config()).eval()
    model.save_pretrained(tmp_path / "bert")
    ids = torch.randint(0, 99, (2, 12))
    ep = torch.export.export(model, (), {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    torch.export.save(ep, tmp_path / "static.pt2")
    code, report, _ = run_cli(
        ["verify", str(tmp_path / "bert"), str(tmp_path / "static.pt2")], capsys
    )
    assert code == 0, report
    assert report["batches"] == [2]
    code, info, _ = run_cli(["info", str(tmp_path / "static.pt2")], capsys)
    assert any("transformers.modeling_outputs" in n for n in info["notes"])


def test_info_names_a_programs_outputs_as_its_caller_sees_them(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    convert_program(samples["hf_bert"], "pt2", tmp_path / "b.pt2", Options())
    code, info, _ = run_cli(["info", str(tmp_path / "b.pt2")], capsys)
    assert code == 0 and [o["name"] for o in info["outputs"]] == [
        "last_hidden_state",
        "pooler_output",
    ]
    assert info["metadata"]["call"].endswith("→ dict[last_hidden_state, pooler_output]")
    code, report, _ = run_cli([str(samples["mlp_zip"]), "--to", "nope"], capsys)
    assert code == 2 and "unknown target format 'nope'" in report["error"]["message"]


def test_user_code_errors_are_named_not_internal(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A factory that raises on its --model-arg (exit 4), a whole-module pickle whose code is
    gone (exit 5), and one given without --trust (exit 11, as the scan's gate says)."""
    import sys

    args = [str(samples["mlp_zip"]), "--to", "pt2", "--model", "fixtures.models:MLP"]
    args += ["--model-arg", "d_hidden='abc'", "--input", "x:2x8:float32"]
    code, report, _ = run_cli([*args, "-o", str(tmp_path / "m.pt2")], capsys)
    assert code == 4 and "factory fixtures.models:MLP raised" in report["error"]["message"]
    (tmp_path / "gone_module.py").write_text(
        "import torch\nclass Gone(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import gone_module  # type: ignore[import-not-found]

    torch.save(gone_module.Gone(), tmp_path / "gone.pt")
    (tmp_path / "gone_module.py").unlink()
    monkeypatch.delitem(sys.modules, "gone_module")
    args = [str(tmp_path / "gone.pt"), "--to", "pt2", "--input", "x:2x8:float32"]
    code, report, _ = run_cli([*args, "--trust", "-o", str(tmp_path / "g.pt2")], capsys)
    assert code == 5 and "'gone_module'" in report["error"]["message"], report
    code, report, _ = run_cli([*args, "-o", str(tmp_path / "g.pt2")], capsys)
    assert code == 11, report
