"""``--onnx-exporter torchscript``: ONNX written by torch.onnx's TorchScript exporter (a trace of
the module, as optimum-cli exports), checked over the dims it declares as the dynamo route's
program is over its ExportedProgram's; chosen explicitly, never as a fallback."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch

import ptconvert
from ptconvert.errors import UsageError, VerificationError
from tests.conftest import run_cli
from tests.convert.test_dynamic_sequence import ONE_TOKEN, _check_fresh, _save
from tests.generation.conftest import build


def test_bert_is_traced_to_onnx_without_torch_export_and_runs_at_other_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory, _ = _save("bert", tmp_path / "bert")
    out = tmp_path / "bert.onnx"
    args = [str(directory), "--to", "onnx", "--dynamic-batch", "--no-cache", "-o", str(out)]
    code, report, _ = run_cli([*args, "--onnx-exporter", "torchscript"], capsys)
    assert code == 0, report
    assert [s["step"] for s in report["steps"]] == [
        "read_weights",
        "build_module",
        "onnx_trace_export",
    ]
    # the check probed the declared dims as it probes an ExportedProgram's
    assert report["dynamic_range"]["input_ids dim 1"].startswith("sequence length 1"), report
    assert report["dynamic_range"]["input_ids dim 0"].startswith("batch 1 or more"), report
    assert report["parity"]["status"] == "pass"
    # onnxruntime in a fresh process against transformers: batch 1 and 3, lengths 1, 7, 23,
    # a padded row; the inputs' dims named as optimum names them
    dims = _check_fresh(out, directory, "base")["dims"]
    assert isinstance(dims, dict)
    assert dims["input_ids"] == dims["token_type_ids"] == ["batch_size", "sequence_length"]
    graph = onnx.load(str(out)).graph
    outputs = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim]
               for o in graph.output}  # fmt: skip
    assert outputs == {
        "last_hidden_state": ["batch_size", "sequence_length", 32],
        "pooler_output": ["batch_size", 32],
    }
    # the weights under the checkpoint's own names (no wrapper's prefix)
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    named = {i.name for i in graph.initializer if "." in i.name}
    assert named and named <= keys, sorted(named - keys)[:5]


def test_a_branch_the_trace_froze_gives_the_sequence_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The model computes otherwise at one token: traced at 16, the graph runs the long path
    at any length; the check's probe at sequence length 1 finds it, an ONNX dim has no bounds to
    keep 1 out, and the sequence (made dynamic by default, not asked for) is traced again at
    the example's 16 tokens. The dynamo route bounds the pt2 instead (test_dynamic_sequence)."""
    from transformers import BertModel

    from fixtures.build import _tiny_bert_config

    (tmp_path / "one_token.py").write_text(ONE_TOKEN)
    torch.manual_seed(0)
    bert = BertModel(_tiny_bert_config(), add_pooling_layer=False).eval()
    torch.save(bert.state_dict(), tmp_path / "bert.pt")
    out = tmp_path / "b.onnx"
    args = [str(tmp_path / "bert.pt"), "--to", "onnx", "--dynamic-batch", "--no-cache"]
    args += ["--model", f"{tmp_path / 'one_token.py'}:make", "-o", str(out)]
    args += ["--input", "input_ids:2x16:int64:0:99", "--input", "attention_mask:2x16:int64:=1"]
    code, report, _ = run_cli([*args, "--onnx-exporter", "torchscript"], capsys)
    assert code == 0, report
    assert any("sequence_length kept at the example's sizes" in n for n in report["notes"])
    assert set(report["dynamic_range"]) == {"input_ids dim 0", "attention_mask dim 0"}
    ids = onnx.load(str(out)).graph.input[0]
    assert [d.dim_param or d.dim_value for d in ids.type.tensor_type.shape.dim] == [
        "batch_size",
        16,
    ]
    assert [s["step"] for s in report["steps"]].count("onnx_trace_export") == 2


def test_the_exporter_is_chosen_never_fallen_back_to(
    samples: dict[str, Path], tmp_path: Path
) -> None:
    directory, _ = _save("bert", tmp_path / "bert")
    default = ptconvert.plan(directory, "onnx", dynamic_batch=True)
    assert [e.step for e in default.edges][-2:] == ["export", "onnx_export"]
    traced = ptconvert.plan(directory, "onnx", dynamic_batch=True, onnx_exporter="torchscript")
    assert [e.step for e in traced.edges][-1] == "onnx_trace_export"
    assert "export" not in [e.step for e in traced.edges]
    # a pt2 holds a program, not a module: TorchScript's exporter has nothing to trace
    from_program = ptconvert.plan(samples["mlp_pt2"], "onnx", onnx_exporter="torchscript")
    assert "onnx_dynamo_exporter" in from_program.missing, from_program.missing


@pytest.mark.parametrize(
    "extra",
    [{"quantize": "int8"}, {"onnx_optimize": True}, {"external_data": True}],
)
def test_what_the_trace_edge_does_not_do_is_refused_by_name(
    tmp_path: Path, extra: dict[str, object]
) -> None:
    directory, _ = _save("bert", tmp_path / "bert")
    with pytest.raises(UsageError, match="not available with --onnx-exporter torchscript"):
        ptconvert.convert(
            directory, "onnx", tmp_path / "b.onnx", onnx_exporter="torchscript", **extra
        )
    assert not (tmp_path / "b.onnx").exists()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_decoder_with_past_is_traced_as_optimum_lays_it_out(family: str, tmp_path: Path) -> None:
    """A decoder with its cache, traced once (batch 2, 3 past and 4 new positions): the check
    generates from an empty past at batch 1 and 2 against transformers' ``generate``; the
    graph's names and dims are optimum's (ORTModelForCausalLM runs it: tests/clients)."""
    source = build(family, tmp_path)
    out = tmp_path / "d.onnx"
    report = ptconvert.convert(
        source, "onnx", out, task="text-generation-with-past", onnx_exporter="torchscript"
    )
    assert report.check == "generation" and report.generation is not None
    assert report.generation.check.status == "pass"
    assert {r.batch for r in report.generation.check.runs} == {1, 2}
    assert any("TorchScript's exporter" in n for n in report.notes), report.notes
    graph = onnx.load(str(out)).graph

    def dims(value: onnx.ValueInfoProto) -> list[object]:
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]

    values = {v.name: dims(v) for v in [*graph.input, *graph.output]}
    assert values["input_ids"] == ["batch_size", "sequence_length"]
    assert values["attention_mask"] == ["batch_size", "past_sequence_length + sequence_length"]
    assert values["past_key_values.0.key"][::2] == ["batch_size", "past_sequence_length"]
    assert values["present.1.value"][2] == "past_sequence_length + sequence_length"
    assert values["logits"][:2] == ["batch_size", "sequence_length"]


def test_a_seq2seq_task_refuses_the_trace_exporter(tmp_path: Path) -> None:
    source = build("t5", tmp_path)
    with pytest.raises(UsageError, match="its encoder and decoders are exported through"):
        ptconvert.convert(
            source,
            "onnx",
            tmp_path / "t5-onnx",
            task="text2text-generation-with-past",
            onnx_exporter="torchscript",
        )
    assert not (tmp_path / "t5-onnx").exists()


MODELS = """
import time

import torch
from torch import nn


class Unrolled(nn.Module):
    # a loop over the length: the trace unrolls it at the example's 16 steps; a call of 0.2 s,
    # as a larger model's: the check's optional probes would then stop at the example's size
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        time.sleep(0.2)
        h = torch.zeros_like(x[:, 0])
        for t in range(x.shape[1]):
            h = torch.tanh(self.fc(x[:, t]) + h)
        return h


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = self.fc(x)
        return y, y.sum(-1)


class Ignoring(Pair):
    def forward(self, x, unused):  # a trace leaves out what it does not read
        return super().forward(x)


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x, scale: float):
        return self.fc(x) * scale
"""


def _module(tmp_path: Path, name: str) -> list[str]:
    """``--model`` and a checkpoint for one of MODELS' classes."""
    import importlib.util

    (tmp_path / "models.py").write_text(MODELS)
    spec = importlib.util.spec_from_file_location("trace_models", tmp_path / "models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    torch.save(getattr(module, name)().state_dict(), tmp_path / f"{name}.pt")
    return [str(tmp_path / f"{name}.pt"), "--model", f"{tmp_path / 'models.py'}:{name}"]


def test_a_trace_right_only_at_its_examples_length_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """However fast the model, the sizes above the example are probed: the unrolled loop
    computes 16 steps at any length, and no such graph is written."""
    out = tmp_path / "u.onnx"
    args = [*_module(tmp_path, "Unrolled"), "--to", "onnx", "--input", "x:2x16x8:float32"]
    args += ["--dynamic", "x:1:1:64", "--onnx-exporter", "torchscript", "--no-cache"]
    code, report, _ = run_cli([*args, "-o", str(out)], capsys)
    assert code == VerificationError.exit_code, report
    assert "no size of a dynamic dimension" in report["error"]["message"], report["error"]
    assert not out.exists()


def test_outputs_are_named_and_only_the_dims_that_follow_an_input_are_dynamic(
    tmp_path: Path,
) -> None:
    """A tuple's outputs get names TorchScript's exporter takes; a classifier's 2 labels stay 2
    though the trace's batch is 2 as well."""
    import onnxruntime as ort
    from transformers import BertForSequenceClassification

    from fixtures.build import _tiny_bert_config

    args = _module(tmp_path, "Pair")
    out = tmp_path / "pair.onnx"
    ptconvert.convert(
        args[0], "onnx", out, model=args[2], inputs=["x:2x8:float32"], dynamic_batch=True,
        onnx_exporter="torchscript", cache=False,
    )  # fmt: skip
    session = ort.InferenceSession(str(out))
    assert [o.name for o in session.get_outputs()] == ["output_0", "output_1"]
    assert [o.shape for o in session.get_outputs()] == [["batch_size", 4], ["batch_size"]]
    torch.manual_seed(0)
    config = _tiny_bert_config()
    config.num_labels = 2
    BertForSequenceClassification(config).eval().save_pretrained(tmp_path / "cls")
    out = tmp_path / "cls.onnx"
    ptconvert.convert(
        tmp_path / "cls", "onnx", out, dynamic_batch=True, onnx_exporter="torchscript", cache=False
    )
    logits = ort.InferenceSession(str(out)).get_outputs()[0]
    assert (logits.name, logits.shape) == ("logits", ["batch_size", 2])


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_the_interface_says_what_the_graph_takes_and_returns(exporter: str, tmp_path: Path) -> None:
    """The report's call line is the file's: the inputs the graph has (a trace drops the one the
    model does not read), the outputs by the graph's names; fed just those, onnxruntime runs."""
    import onnxruntime as ort

    args = _module(tmp_path, "Ignoring")
    out = tmp_path / "ignoring.onnx"
    report = ptconvert.convert(
        args[0], "onnx", out, model=args[2], inputs=["x:2x8:float32", "unused:2x8:float32"],
        dynamic_batch=True, onnx_exporter=exporter, cache=False,
    )  # fmt: skip
    session = ort.InferenceSession(str(out))
    graph_inputs = [i.name for i in session.get_inputs()]
    graph_outputs = [o.name for o in session.get_outputs()]
    face = report.interface
    assert face["inputs"] == graph_inputs and face["outputs"] == graph_outputs, face
    assert list(face["example"]) == graph_inputs
    if exporter == "torchscript":
        assert graph_inputs == ["x"] and graph_outputs == ["output_0", "output_1"]
        assert '"unused"' not in face["call"], face["call"]
        assert not any("unused" in line for line in face["accepts"]), face["accepts"]
    feeds = {n: torch.randn(3, *face["example"][n][1:]).numpy() for n in face["inputs"]}
    assert [r.shape for r in session.run(face["outputs"], feeds)] == [(3, 4), (3,)]


def test_a_scalar_the_graph_fixed_is_said_though_no_graph_input_names_it(tmp_path: Path) -> None:
    """``scale=2.0`` is a constant of the ONNX graph, not an input: the call line leaves it
    out, and the interface says the value it was fixed at."""
    import onnxruntime as ort

    args = _module(tmp_path, "Scaled")
    out = tmp_path / "scaled.onnx"
    report = ptconvert.convert(
        args[0], "onnx", out, model=args[2], inputs=["x:2x8:float32", "scale::float32=2.0"],
        dynamic_batch=True, cache=False,
    )  # fmt: skip
    assert [i.name for i in ort.InferenceSession(str(out)).get_inputs()] == ["x"]
    face = report.interface
    assert face["inputs"] == ["x"] and '"scale"' not in face["call"], face
    assert any("fixed at their example values (scale=2.0)" in a for a in face["accepts"]), face


def test_vit_keeps_its_configured_image_size_when_the_trace_fails_at_others(
    tmp_path: Path,
) -> None:
    """optimum declares ViT's height and width dynamic though its position table takes one
    size; here the check finds the trace failing at other sizes and traces it again with them
    at the example's, as the export route gives them up."""
    import transformers

    config = transformers.ViTConfig(
        image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=37, num_labels=3,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.ViTForImageClassification(config).eval().save_pretrained(tmp_path / "vit")
    out = tmp_path / "vit.onnx"
    report = ptconvert.convert(
        tmp_path / "vit", "onnx", out, dynamic_batch=True, onnx_exporter="torchscript", cache=False
    )
    assert list(report.dynamic_range) == ["pixel_values dim 0"], report.dynamic_range
    assert any("height and width kept at the example's sizes" in n for n in report.notes)
    (pixels,) = onnx.load(str(out)).graph.input
    assert [d.dim_param or d.dim_value for d in pixels.type.tensor_type.shape.dim] == [
        "batch_size", 3, 32, 32,
    ]  # fmt: skip


@pytest.mark.parametrize("task", [None, "text-generation-with-past"])
def test_a_rope_that_changes_with_the_length_is_refused(task: str | None, tmp_path: Path) -> None:
    """Dynamic NTK rope recomputes its frequencies past the config's positions (a branch on
    the length): a trace freezes it, and the graph computed 4–9 off eager there, beyond what the
    check reaches."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        rope_scaling={"rope_type": "dynamic", "factor": 4.0},
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(tmp_path / "llama")
    out = tmp_path / "l.onnx"
    with pytest.raises(ptconvert.errors.UnsupportedConversionError, match=r"rope \(dynamic\)"):
        ptconvert.convert(
            tmp_path / "llama", "onnx", out, dynamic_batch=True, task=task,
            onnx_exporter="torchscript", cache=False,
        )  # fmt: skip
    assert not out.exists()


def test_a_trace_does_not_import_the_dynamo_exporters_translations(tmp_path: Path) -> None:
    """onnxscript (torch.onnx's dynamo translations, 0.65 s to import) is not what a trace
    needs: left out, the decoder with past converts as fast as optimum-cli (benchmarks/onnx.py)."""
    import subprocess
    import sys

    source = build("gpt2", tmp_path)
    code = (
        "import sys, ptconvert; ptconvert.convert(sys.argv[1], 'onnx', sys.argv[2], "
        "task='text-generation-with-past', onnx_exporter='torchscript', cache=False); "
        "print('onnxscript' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(source), str(tmp_path / "g.onnx")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"
