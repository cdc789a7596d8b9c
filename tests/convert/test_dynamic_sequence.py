"""A Hugging Face text model converted with --dynamic-batch takes any batch and any sequence
length up to its config's max_position_embeddings (optimum's batch_size × sequence_length),
checked in a fresh process against the transformers model itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fixtures.build import _more_hf_models, _tiny_bert_config, _tiny_gpt2_config
from ptconvert.convert.engine import convert_program
from ptconvert.options import Options
from tests.conftest import run_cli

# loads the artifact as a user does (torch alone for a .pt2, onnxruntime for ONNX) and the
# transformers model from the same directory, runs both at batch 1 and 3 × length 1, 7 and 23
_CHECK = """
import json, sys
import torch, transformers
art, directory, kind = sys.argv[1:4]
model = transformers.AutoModel.from_pretrained(directory) if kind == "base" else (
    transformers.AutoModelForCausalLM.from_pretrained(directory))
model.eval()
if art.endswith(".onnx"):
    import onnxruntime
    session = onnxruntime.InferenceSession(art)
    wanted = [i.name for i in session.get_inputs()]
    names = [o.name for o in session.get_outputs()]
    dims = {i.name: [d if isinstance(d, str) else int(d) for d in i.shape]
            for i in session.get_inputs()}
    def run(**kw):
        outs = session.run(None, {k: v.numpy() for k, v in kw.items() if k in wanted})
        return dict(zip(names, (torch.from_numpy(o) for o in outs)))
else:
    dims = None
    program = torch.export.load(art).module()
    def run(**kw):
        return program(**kw)
gen = torch.Generator().manual_seed(1)
worst = {}
for batch in (1, 3):
    for length in (1, 7, 23):
        ids = torch.randint(0, model.config.vocab_size, (batch, length), generator=gen)
        mask = torch.ones(batch, length, dtype=torch.int64)
        if batch > 1 and length > 2:
            mask[-1, -2:] = 0
        types = getattr(model.config, "type_vocab_size", 1)  # BERT's segments: an input too
        extra = {"token_type_ids": torch.randint(0, types, (batch, length), generator=gen)}
        extra = extra if types > 1 else {}
        with torch.no_grad():
            ref = model(input_ids=ids, attention_mask=mask, use_cache=False, **extra)
        out = run(input_ids=ids, attention_mask=mask, **extra)
        key = "logits" if "logits" in out else "last_hidden_state"
        got, want = out[key], getattr(ref, key)
        assert got.shape == want.shape, (batch, length, got.shape, want.shape)
        worst[f"{batch}x{length}"] = (got - want).abs().max().item()
print(json.dumps({"worst": worst, "dims": dims}))
"""


def _check_fresh(artifact: Path, directory: Path, kind: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", _CHECK, str(artifact), str(directory), kind],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    worst = result["worst"]
    assert isinstance(worst, dict) and len(worst) == 6
    assert max(worst.values()) < 1e-4, worst
    return result


def _save(kind: str, directory: Path) -> tuple[Path, str]:
    from transformers import BertModel, GPT2LMHeadModel

    torch.manual_seed(0)
    if kind == "bert":
        BertModel(_tiny_bert_config()).eval().save_pretrained(directory)
        return directory, "base"
    if kind == "gpt2":
        GPT2LMHeadModel(_tiny_gpt2_config()).eval().save_pretrained(directory)
        return directory, "causal"
    config, cls = _more_hf_models()[kind]
    cls(config).eval().save_pretrained(directory)
    return directory, "causal"


@pytest.mark.parametrize(
    ("kind", "to"),
    [
        ("bert", "pt2"),
        ("gpt2", "onnx"),
        pytest.param("gpt2", "pt2", marks=pytest.mark.slow),
        pytest.param("bert", "onnx", marks=pytest.mark.slow),
        pytest.param("llama", "pt2", marks=pytest.mark.slow),
        pytest.param("llama", "onnx", marks=pytest.mark.slow),
    ],
)
def test_dynamic_batch_makes_the_sequence_dynamic_up_to_the_config(
    kind: str, to: str, tmp_path: Path
) -> None:
    directory, head = _save(kind, tmp_path / kind)
    out = tmp_path / f"{kind}.{to}"
    report = convert_program(directory, to, out, Options(dynamic_batch=True, cache=False))
    words = report.dynamic_range
    # verification ran the sequence at 1, an odd length and the config's 64, against eager
    assert words["input_ids dim 1"] == "sequence length 2–64; also runs at 1", words
    assert words["attention_mask dim 1"] == words["input_ids dim 1"]
    assert any("(sequence_length: sequence length 2–64)" in n for n in report.notes), report.notes
    result = _check_fresh(out, directory, head)
    if to == "onnx":  # named as optimum names them (batch_size, sequence_length)
        dims = result["dims"]
        assert isinstance(dims, dict)
        assert dims["input_ids"] == dims["attention_mask"] == ["batch_size", "sequence_length"]


def test_static_sequence_keeps_the_examples_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory, _ = _save("bert", tmp_path / "bert")
    out = tmp_path / "b.pt2"
    args = [str(directory), "--to", "pt2", "--dynamic-batch", "--static-sequence", "--no-cache"]
    code, report, _ = run_cli([*args, "-o", str(out)], capsys)
    assert code == 0, report
    assert set(report["dynamic_range"]) == {
        "input_ids dim 0",
        "attention_mask dim 0",
        "token_type_ids dim 0",
    }
    program = torch.export.load(out).module()
    ids = torch.zeros(3, 16, dtype=torch.int64)
    # another batch runs
    program(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=ids)
    short = ids[:, :7]
    with pytest.raises(Exception, match="16"):  # another length is refused
        program(input_ids=short, attention_mask=torch.ones_like(short), token_type_ids=short)


def test_plan_says_which_dims_will_be_dynamic_and_over_which_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory, _ = _save("gpt2", tmp_path / "gpt2")
    code, plan, _ = run_cli(["plan", str(directory), "--to", "onnx", "--dynamic-batch"], capsys)
    assert code == 0, plan
    assert "1–64 (the config's limit)" in plan["dynamic"]["sequence_length"]
    assert plan["dynamic"]["batch"].startswith("dim 0 of every tensor input")
    args = ["plan", str(directory), "--to", "onnx", "--dynamic-batch", "--static-sequence"]
    code, plan, _ = run_cli(args, capsys)
    assert code == 0 and set(plan["dynamic"]) == {"batch"}
    code, plan, _ = run_cli(["plan", str(directory), "--to", "onnx"], capsys)
    assert code == 0 and plan["dynamic"] == {}  # without --dynamic-batch: the example's shapes


ONE_TOKEN = """
import torch
from transformers import BertConfig, BertModel


class OneToken(BertModel):
    # a single token takes another path: the export traced at 16 tokens computes the long path
    def forward(self, input_ids, attention_mask=None):
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask)
        if input_ids.shape[1] == 1:
            out.last_hidden_state = out.last_hidden_state * 2
        return out


def make():
    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=37, max_position_embeddings=64)
    return OneToken(config, add_pooling_layer=False).eval()
"""


def test_a_length_the_program_gets_wrong_bounds_the_sequence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model that computes otherwise at one token: the program exported at 16 tokens runs
    at 1 and returns other numbers there; the sequence is exported again from 2 and refuses 1."""
    from transformers import BertModel

    (tmp_path / "one_token.py").write_text(ONE_TOKEN)
    torch.manual_seed(0)
    bert = BertModel(_tiny_bert_config(), add_pooling_layer=False).eval()
    torch.save(bert.state_dict(), tmp_path / "bert.pt")
    out = tmp_path / "b.pt2"
    args = [str(tmp_path / "bert.pt"), "--to", "pt2", "--dynamic-batch", "--no-cache"]
    args += ["--model", f"{tmp_path / 'one_token.py'}:make", "-o", str(out)]
    args += ["--input", "input_ids:2x16:int64:0:99", "--input", "attention_mask:2x16:int64:=1"]
    code, report, _ = run_cli(args, capsys)
    assert code == 0, report
    assert any("input_ids dim 1 bounded to 2–64" in n for n in report["notes"]), report["notes"]
    program = torch.export.load(out).module()
    ids = torch.randint(0, 99, (3, 7))
    got = program(input_ids=ids, attention_mask=torch.ones_like(ids))["last_hidden_state"]
    torch.testing.assert_close(got, bert(input_ids=ids).last_hidden_state)
    with pytest.raises(Exception, match="Guard failed"):
        program(input_ids=ids[:, :1], attention_mask=torch.ones_like(ids[:, :1]))
