"""libtorch's C++ loaders on ptconvert's TorchScript and AOTInductor files: the C++ loader
(loader.cpp, compiled against the clients' venv's libtorch) runs each file as a C++ user would
(``torch::jit::load``; ``AOTIModelPackageLoader``; a greedy loop over a generation package) and
its outputs match the eager model here, at batch 1 and another batch (``--dynamic-batch``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ptconvert
from fixtures.models import MLP
from tests.clients.conftest import eager_classifier, run_client, tiny_bert_classifier
from tests.generation.conftest import build, eager, reference

pytestmark = pytest.mark.clients

ROUTES = [("torchscript", "mlp.ts.pt"), ("aoti", "mlp.aoti.pt2")]


@pytest.mark.parametrize(("to", "name"), ROUTES)
def test_mlp_runs_in_libtorch_as_eager(to: str, name: str, loader: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MLP().eval()
    weights = tmp_path / "mlp.pt"
    torch.save(model.state_dict(), weights)
    out = tmp_path / name
    report = ptconvert.convert(
        weights, to, out, model="fixtures.models:MLP", inputs=["x:2x8:float32"], dynamic_batch=True
    )
    assert report.check == "parity"
    for rows in (1, 3):
        x = torch.randn((rows, 8), generator=torch.Generator().manual_seed(rows))
        got = run_client([loader, to, out], [x], tmp_path, f"{to}-{rows}")
        with torch.no_grad():
            want = model(x)
        torch.testing.assert_close(got[0], want)


def bert_inputs(rows: int) -> dict[str, torch.Tensor]:
    """``rows`` token rows, the last one padded (its mask ends in zeros)."""
    ids = torch.randint(3, 98, (rows, 9), generator=torch.Generator().manual_seed(rows))
    mask = torch.ones_like(ids)
    mask[-1, 6:] = 0
    types = torch.zeros_like(ids)
    types[:, 4:] = 1  # a sentence pair: the second sentence's tokens are type 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


@pytest.mark.parametrize("to", ["torchscript", "aoti"])
def test_bert_classifier_runs_in_libtorch_as_eager(to: str, loader: Path, tmp_path: Path) -> None:
    """A tiny BertForSequenceClassification: the inputs the program takes (the report's
    interface, in its order: token_type_ids among them, issue 40) fed by the C++ loader on
    sentence pairs; logits against transformers' eager model."""
    source = tiny_bert_classifier(tmp_path)
    out = tmp_path / ("bert.ts.pt" if to == "torchscript" else "bert.aoti.pt2")
    report = ptconvert.convert(source, to, out, dynamic_batch=True)
    names = report.interface["inputs"]
    model = eager_classifier(source)
    for rows in (1, 2):
        inputs = bert_inputs(rows)
        assert "token_type_ids" in names, names
        got = run_client([loader, to, out], [inputs[n] for n in names], tmp_path, f"b{rows}")
        (logits,) = got  # the one output, logits
        with torch.no_grad():
            want = model(**{n: inputs[n] for n in names}).logits
        torch.testing.assert_close(logits, want, atol=1e-5, rtol=1e-5)


def test_aoti_generation_package_generates_greedily_in_cpp(loader: Path, tmp_path: Path) -> None:
    """``--to aoti --task text-generation-with-past`` of a tiny GPT-2 driven by a greedy loop in
    C++ (the whole prompt at positions 0..n-1, then one token a step, ``input_ids`` and
    ``cache_position``; the cache in the package's buffers): transformers' greedy tokens, at
    the package's batch (2, the default cache's rows)."""
    source = build("gpt2", tmp_path)
    out = tmp_path / "gpt2.aoti.pt2"
    report = ptconvert.convert(source, "aoti", out, task="text-generation-with-past")
    assert report.check == "generation"
    ids = torch.randint(3, 98, (2, 5), generator=torch.Generator().manual_seed(7))
    new_tokens = 12
    got = run_client([loader, "generate", out], [ids, torch.tensor(new_tokens)], tmp_path, "gen")
    want = reference(eager(source), ids, new_tokens).sequences
    assert len(set(want[:, 5:].flatten().tolist())) > 3  # not one token repeated
    assert torch.equal(got, want)
