"""``--to pte``: ExecuTorch programs from a checkpoint with ``--model`` and from tiny Hugging Face
directories, each run by ExecuTorch's own runtime in a new Python process at batch 1 and 3 and
compared with the eager model there; the dynamic dims bounded (ExecuTorch plans memory for the
largest sizes), ``--pte-backend portable``, and the missing extra said as such."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from fixtures.models import MLP
from tests.conftest import run_cli

pytest.importorskip("executorch")

MLP_ARGS = ["--model", "fixtures.models:MLP", "--input", "x:2x8:float32"]

# a new interpreter: the file loaded by ExecuTorch's runtime, forward run on each batch's
# inputs (a list, in the program's input order); every output, or the runtime's refusal
_RUN_FRESH = """
import sys, torch
from executorch.runtime import Runtime
path, feeds, out = sys.argv[1:4]
method = Runtime.get().load_program(path).load_method("forward")
results = {}
for batch, inputs in torch.load(feeds).items():
    try:
        results[batch] = [t.clone() for t in method.execute(inputs)]
    except RuntimeError as exc:
        results[batch] = str(exc)
torch.save(results, out)
"""


def run_fresh(path: Path, feeds: dict[int, list[torch.Tensor]], tmp: Path) -> dict[int, Any]:
    """Each batch's outputs of ``path``, computed by ExecuTorch in a new Python process."""
    torch.save(feeds, tmp / "feeds.pt")
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_FRESH, str(path), str(tmp / "feeds.pt"), str(tmp / "out.pt")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    results: dict[int, Any] = torch.load(tmp / "out.pt")
    return results


def mlp(samples: dict[str, Path]) -> torch.nn.Module:
    model = MLP().eval()
    model.load_state_dict(torch.load(samples["mlp_zip"], weights_only=True))
    return model


def test_a_checkpoint_converts_to_a_bounded_pte_that_executorch_runs(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mlp.pte"
    args = [str(samples["mlp_zip"]), "--to", "pte", *MLP_ARGS, "--dynamic-batch", "-o", str(out)]
    code, report, _ = run_cli(args, capsys)
    assert code == 0, report
    assert report["route"][-1] == "exported → pte" and report["check"] == "parity"
    assert [s["batch"] for s in report["parity"]["sizes"]] == [1, 2, 3, 5, 7]
    assert report["dynamic_range"] == {"x dim 0": "batch 1–8"}  # the default bound, probed
    notes = " ".join(report["notes"])
    assert "x dim 0 up to 8" in notes and "1 × XnnpackBackend" in notes
    assert report["interface"]["call"] == "prog.execute([x])"

    model, x = mlp(samples), torch.randn(9, 8, generator=torch.Generator().manual_seed(3))
    got = run_fresh(out, {1: [x[:1]], 3: [x[:3]], 9: [x]}, tmp_path)
    for b in (1, 3):
        torch.testing.assert_close(got[b][0], model(x[:b]), rtol=1e-4, atol=1e-5)
    assert isinstance(got[9], str)  # past the bound: the runtime refuses it

    code, info, _ = run_cli(["info", str(out)], capsys)
    assert code == 0 and (info["format"], info["layout"]) == ("pte", "flatbuffer")
    assert [(i["name"], i["dtype"], i["shape"]) for i in info["inputs"]] == [
        ("input_0", "float32", [8, 8])
    ]
    assert info["metadata"]["delegates"] == {"XnnpackBackend": 1}
    assert info["metadata"]["methods"]["forward"]["portable_ops"] == {}


def test_the_portable_backend_runs_every_op_on_the_portable_kernels(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mlp.pte"
    args = [str(samples["mlp_zip"]), "--to", "pte", *MLP_ARGS, "--pte-backend", "portable"]
    code, report, _ = run_cli([*args, "-o", str(out)], capsys)
    assert code == 0, report
    assert [s["batch"] for s in report["parity"]["sizes"]] == [2]  # a static program
    assert "every op on ExecuTorch's portable kernels" in " ".join(report["notes"])
    code, info, _ = run_cli(["info", str(out)], capsys)
    assert info["metadata"]["delegates"] == {}
    assert info["metadata"]["methods"]["forward"]["portable_ops"]  # (the check ran ExecuTorch's
    # runtime on the file in a spawned process: the other tests run it in a fresh one too)


def test_without_the_extra_the_error_names_it(
    samples: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "executorch", None)  # as if it were not installed
    out = tmp_path / "mlp.pte"
    code, report, _ = run_cli(
        [str(samples["mlp_zip"]), "--to", "pte", *MLP_ARGS, "-o", str(out)], capsys
    )
    assert code == 5 and report["error"]["type"] == "MissingRequirementError"
    assert "needs executorch" in report["error"]["message"]
    assert "pip install -e '.[executorch]'" in report["error"]["hint"]
    assert not out.exists()
    code, plan, _ = run_cli(["plan", str(samples["mlp_zip"]), "--to", "pte", *MLP_ARGS], capsys)
    assert plan["missing"] == {"executorch": report["error"]["hint"]}


# (the Auto class that loads the directory, the output compared)
HF = {"hf_bert": ("AutoModel", "last_hidden_state"), "hf_llama": ("AutoModelForCausalLM", "logits")}


@pytest.mark.slow  # ExecuTorch's XNNPACK lowering of a transformer takes 15-25 s
@pytest.mark.parametrize("name", sorted(HF))
def test_tiny_hf_models_convert_with_a_dynamic_batch_and_sequence(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    import transformers

    out = tmp_path / f"{name}.pte"
    code, report, _ = run_cli(
        [str(samples[name]), "--to", "pte", "--dynamic-batch", "-o", str(out)], capsys
    )
    assert code == 0, report
    assert report["check"] == "parity"
    assert [s["batch"] for s in report["parity"]["sizes"]] == [1, 2, 3, 5, 7]
    # the batch bounded at 8, the sequence at the config's 64 positions
    assert report["dynamic_range"]["input_ids dim 0"] == "batch 1–8"
    assert report["dynamic_range"]["input_ids dim 1"].startswith("sequence length 2–64")

    auto, output = HF[name]
    model = getattr(transformers, auto).from_pretrained(samples[name]).eval()
    names = ["input_ids", "attention_mask"]
    if getattr(model.config, "type_vocab_size", 1) > 1:  # BERT's segment ids: an input too
        names.append("token_type_ids")
    g = torch.Generator().manual_seed(5)
    feeds: dict[int, list[torch.Tensor]] = {}
    for batch, length in ((1, 16), (3, 7)):
        ids = torch.randint(0, 99, (batch, length), generator=g)
        feeds[batch] = [ids, torch.ones_like(ids), ids % 2][: len(names)]
    got = run_fresh(out, feeds, tmp_path)
    with torch.no_grad():
        for batch, tensors in feeds.items():
            want = getattr(model(**dict(zip(names, tensors, strict=True))), output)
            torch.testing.assert_close(got[batch][0], want, rtol=1e-4, atol=1e-4)

    code, info, _ = run_cli(["info", str(out)], capsys)
    assert [i["name"] for i in info["inputs"]] == names
    assert [i["shape"] for i in info["inputs"]] == [[8, 64]] * len(names)
    assert info["outputs"][0]["name"] == output
    assert set(info["metadata"]["delegates"]) == {"XnnpackBackend"}


# a new interpreter: greedy decoding over one loaded method (the test's own loop, not
# ptconvert's runner), one row at a time as ExecuTorch's LLM runners feed it
_GENERATE_FRESH = """
import sys, torch
from executorch.runtime import Runtime
path, prompts, out, new = sys.argv[1], torch.load(sys.argv[2]), sys.argv[3], int(sys.argv[4])
method = Runtime.get().load_program(path).load_method("forward")
def call(ids, position):
    positions = torch.arange(position, position + ids.shape[1])
    return method.execute([ids.contiguous(), positions])[0][:, -1]
results = []
for ids in prompts:
    tokens = [call(ids, 0).argmax(-1)]  # position 0: a new sequence in the same buffers
    for k in range(new - 1):
        tokens.append(call(tokens[-1][:, None], ids.shape[1] + k).argmax(-1))
    results.append(torch.stack(tokens, 1))
torch.save(results, out)
"""


@pytest.mark.slow  # the static-cache program's XNNPACK lowering takes ~20 s
def test_a_llama_with_its_static_cache_generates_as_transformers(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.generation.conftest import eager, reference

    out = tmp_path / "llama.pte"
    args = [str(samples["hf_llama"]), "--to", "pte", "--task", "text-generation-with-past"]
    code, report, _ = run_cli([*args, "-o", str(out)], capsys)
    assert code == 0, report
    assert report["check"] == "generation" and report["generation"]["check"]["status"] == "pass"
    # the directory has no tokenizer: ExecuTorch's runner is not run, and the report says why
    assert (
        "not run in ExecuTorch's TextLLMRunner: the directory has no tokenizer.json"
        in (report["generation"]["check"]["notes"])
    )
    # one row, as ExecuTorch's LLM runners feed it (issue 40: a cache of 2 rows failed there)
    assert report["generation"]["cache"] == {"kind": "static", "batch_size": 1, "length": 64}
    assert {r["batch"] for r in report["generation"]["check"]["runs"]} == {1}

    g = torch.Generator().manual_seed(7)
    prompts = [
        torch.randint(3, 99, (rows, length), generator=g) for rows, length in ((1, 4), (1, 9))
    ]
    torch.save(prompts, tmp_path / "prompts.pt")
    proc = subprocess.run(
        [sys.executable, "-c", _GENERATE_FRESH, str(out), str(tmp_path / "prompts.pt"),
         str(tmp_path / "tokens.pt"), "12"],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    model = eager(samples["hf_llama"])
    for ids, got in zip(prompts, torch.load(tmp_path / "tokens.pt"), strict=True):
        want = reference(model, ids, 12).sequences[:, ids.shape[1] :]
        assert torch.equal(got, want), (got, want)

    code, info, _ = run_cli(["info", str(out)], capsys)
    assert info["metadata"]["task"] == "text-generation-with-past"
    assert info["metadata"]["constant_methods"]["get_max_seq_len"] == 64
    assert info["metadata"]["constant_methods"]["get_max_batch_size"] == 1


def _llama_with_tokenizer(tmp_path: Path) -> Path:
    from tests.generation.conftest import build, write_tokenizer

    source = build("llama", tmp_path)  # initializer_range 0.3: greedy picks many tokens
    write_tokenizer(source / "tokenizer.json")
    return source


@pytest.mark.slow  # the static-cache program's lowering, then ExecuTorch's runner: ~1 min
def test_an_llm_pte_generates_as_transformers_in_text_llm_runner(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """With a tokenizer.json beside the model the conversion's check also runs the program in
    ExecuTorch's TextLLMRunner (a process of its own), and says so in one note; the runner's
    printing stays off ``--json``'s stdout (capfd: the child's file descriptors too)."""
    pytest.importorskip("executorch.extension.llm.runner")
    source = _llama_with_tokenizer(tmp_path)
    args = [str(source), "--to", "pte", "--task", "text-generation-with-past"]
    code, report, _ = run_cli([*args, "-o", str(tmp_path / "llama.pte")], capfd)
    assert code == 0, report
    ran = [n for n in report["generation"]["check"]["notes"] if "TextLLMRunner" in n]
    assert len(ran) == 1 and ran[0].startswith("ran in ExecuTorch's TextLLMRunner"), ran
    assert "greedy tokens for the prompt" in ran[0] and "match transformers'" in ran[0]
    assert ran[0] in report["notes"]


@pytest.mark.slow  # the static-cache program's lowering, then ExecuTorch's runner: ~1 min
def test_a_runner_that_generates_otherwise_fails_the_conversion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner runs in a child: what it is compared with (transformers' tokens) is changed
    at the fourth token, and the conversion fails there naming the runner (exit 6, nothing
    written)."""
    pytest.importorskip("executorch.extension.llm.runner")
    from ptconvert.generation import text_check

    real = text_check.expected_tokens

    def shifted(*args: Any) -> list[int]:
        tokens = real(*args)
        return [(t + 1) % 99 if k == 3 else t for k, t in enumerate(tokens)]

    monkeypatch.setattr(text_check, "expected_tokens", shifted)
    source = _llama_with_tokenizer(tmp_path)
    out = tmp_path / "llama.pte"
    args = [str(source), "--to", "pte", "--task", "text-generation-with-past", "-o", str(out)]
    code, report, _ = run_cli(args, capsys)
    assert code == 6, report
    message = report["error"]["message"]
    assert "TextLLMRunner generates differently from transformers" in message, message
    assert "for the prompt '" in message and "new token 3:" in message, message
    assert not out.exists()


def test_an_llm_pte_is_written_for_one_row_unless_more_are_asked(
    samples: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """ExecuTorch's TextLLMRunner feeds batch 1: the default static cache has one row (its
    check generates at batch 1); --batch-sizes asks for more."""
    args = ["plan", str(samples["hf_llama"]), "--to", "pte", "--task", "text-generation-with-past"]
    code, plan, _ = run_cli(args, capsys)
    assert code == 0 and "static cache, batch 1," in plan["steps"][-1]["what"], plan
    assert "greedy tokens at batch 1 and" in plan["check"]
    code, plan, _ = run_cli([*args, "--batch-sizes", "1,2"], capsys)
    assert code == 0 and "static cache, batch 2," in plan["steps"][-1]["what"], plan
