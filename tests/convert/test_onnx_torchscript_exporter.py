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


def test_a_branch_the_trace_froze_is_refused_not_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The model computes otherwise at one token: traced at 16, the ONNX graph runs the long
    path at any length; the check's probe at sequence length 1 finds it, and an ONNX dim has no
    bounds to keep 1 out, so nothing is written. The dynamo route bounds the pt2 instead
    (test_dynamic_sequence)."""
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
    assert code == VerificationError.exit_code, report
    assert "input_ids dim 1 at 1" in report["error"]["message"], report["error"]
    assert not out.exists()
    assert not list(tmp_path.glob(".b.onnx*"))  # no staging folder left behind


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


def test_a_generation_task_refuses_the_trace_exporter(tmp_path: Path) -> None:
    directory, _ = _save("gpt2", tmp_path / "gpt2")
    with pytest.raises(UsageError, match=r"generation exports go through torch\.export"):
        ptconvert.convert(
            directory,
            "onnx",
            tmp_path / "g",
            task="text-generation-with-past",
            onnx_exporter="torchscript",
        )
