"""``--trust`` enforced where the file is loaded: the rebuilding unpickler resolves exactly the
classes the scan named (and the user trusted) and calls none of their code, so a gadget the
scanner misses still cannot run; ``--allow`` trusts classes one by one; a route never unpickles a
file it wrote."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

import ptconvert
from fixtures.scan_corpus import Reduce
from ptconvert.scan import guard as guard_module
from ptconvert.scan.analysis import INSTANTIATES, Finding
from ptconvert.scan.scanner import FileScan
from ptconvert.scan.trusted_load import trusted_load
from tests.conftest import run_cli

NET_SOURCE = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.fc(x))

def helper_with_effect(path):
    open(path, "w").close()


class Effect:
    def __init__(self, path):
        open(path, "w").close()


class Slotted:
    __slots__ = ("fn",)
"""
NET = "trustnet.Net"
LINEAR = "torch.nn.modules.linear.Linear"


@pytest.fixture
def net_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A user module ``trustnet`` (importable for this test only)."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "trustnet.py").write_text(NET_SOURCE)
    monkeypatch.syspath_prepend(str(code))
    import trustnet  # type: ignore[import-not-found]

    yield trustnet
    sys.modules.pop("trustnet", None)


def _needs_code(path: Path, *classes: str) -> FileScan:
    """What a scan that saw only these classes would say (a scanner that missed a gadget)."""
    findings = [Finding("needs-code", "data.pkl", 0, "NEWOBJ", c, INSTANTIATES) for c in classes]
    return FileScan(str(path), "needs-code", findings, 1)


def _missed(monkeypatch: pytest.MonkeyPatch, *classes: str) -> None:
    monkeypatch.setattr(guard_module, "_scan", lambda p: _needs_code(p, *classes))


def test_a_gadget_the_scan_missed_does_not_run_under_trust(
    net_module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The scan is made to miss an ``os.system`` call inside a trusted module: the load itself
    refuses it (exit 10: the unpickler resolves only what the scan cleared), nothing runs,
    nothing is written."""
    marker = tmp_path / "PAYLOAD_RAN"
    model = net_module.Net()
    model.payload = Reduce(os.system, f"touch {marker}")
    src = tmp_path / "net.pt"
    torch.save(model, src)
    _missed(monkeypatch, NET, LINEAR)
    out = tmp_path / "out"
    for extra in (["--to", "torchscript"], ["--to", "pt2", "--input", "x:2x4:float32"]):
        code, body, _ = run_cli([str(src), *extra, "-o", str(out), "--trust"], capsys)
        assert code == 10, body  # refused by the probe's own scan, in its process
        assert not marker.exists() and not out.exists()
    with pytest.raises(ptconvert.UnsafeInputError, match="did not clear"):
        trusted_load(src, trust=True, timeout=None)  # posix.system resolves to nothing
    assert not marker.exists()


def test_a_whole_module_loads_through_the_rebuilding_unpickler(
    net_module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ptconvert.pickles import rebuild

    src = tmp_path / "net.pt"
    torch.save(net_module.Net().eval(), src)
    loads: list[object] = []
    real_load = torch.load

    def spy(f, *args, **kwargs):
        if str(f) == str(src):  # not the check's reading of its own outputs
            loads.append(kwargs.get("pickle_module"))
        return real_load(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    report = ptconvert.convert(
        src, "torchscript", tmp_path / "net.ts", trust=True, inputs=["x:2x4:float32"]
    )
    assert report.parity is not None and report.parity.status == "pass"
    assert loads and all(m is rebuild for m in loads), loads
    assert any("without running their code" in n and NET in n for n in report.notes), report.notes
    scripted = torch.jit.load(str(tmp_path / "net.ts"))
    x = torch.randn(3, 4)
    assert torch.allclose(
        scripted(x), net_module.Net.forward(torch.load(src, weights_only=False), x)
    )


def test_allow_trusts_classes_one_by_one(net_module, tmp_path: Path, capsys) -> None:
    src = tmp_path / "net.pt"
    torch.save(net_module.Net().eval(), src)
    out = tmp_path / "net.ts"
    code, body, _ = run_cli(
        [str(src), "--to", "torchscript", "-o", str(out), "--allow", NET], capsys
    )
    assert code == 11 and not out.exists(), body
    assert LINEAR in body["error"]["message"] and NET not in body["error"]["message"]
    argv = [str(src), "--to", "torchscript", "-o", str(out), "--allow", NET, "--allow", LINEAR]
    code, body, _ = run_cli(argv, capsys)
    assert code == 0, body
    assert torch.jit.load(str(out))(torch.randn(1, 4)).shape == (1, 3)


def test_a_call_of_a_function_the_scan_missed_is_refused_at_load(
    net_module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trust admits constructing classes: a function the pickle calls (the scan made to miss
    it) is allowlisted only as a stand-in, so the call raises and the function never runs."""
    marker = tmp_path / "HELPER_RAN"
    model = net_module.Net()
    model.payload = Reduce(net_module.helper_with_effect, str(marker))
    src = tmp_path / "net.pt"
    torch.save(model, src)
    _missed(monkeypatch, NET, LINEAR, "trustnet.helper_with_effect")
    with pytest.raises(ptconvert.UnsafeInputError, match=r"calls trustnet\.helper_with_effect"):
        trusted_load(src, trust=True, timeout=None)  # no probe: its scan would not miss it
    assert not marker.exists()


def test_functions_kept_as_values_load_as_themselves(tmp_path: Path) -> None:
    """A real whole-module pickle keeps activation functions as attributes (BERT's GELU holds
    ``torch._C._nn.gelu``): allowlisted, never called by the load, the function after it."""
    import transformers

    config = _tiny_bert_config()
    torch.manual_seed(0)
    src = tmp_path / "bert.pt"
    torch.save(transformers.BertModel(config).eval(), src)
    loaded = trusted_load(src, trust=True).value
    act = loaded.encoder.layer[0].intermediate.intermediate_act_fn.act
    assert act is torch._C._nn.gelu
    reference = torch.load(src, weights_only=False)  # the test's own trusted file
    ids = torch.randint(0, 99, (2, 5))
    assert torch.equal(loaded(ids).last_hidden_state, reference(ids).last_hidden_state)


def test_an_unimportable_class_says_which_module(tmp_path: Path, net_module) -> None:
    src = tmp_path / "net.pt"
    torch.save(net_module.Net().eval(), src)
    sys.modules.pop("trustnet")
    sys.path.remove(str(tmp_path / "code"))
    with pytest.raises(ptconvert.MissingRequirementError, match="'trustnet'"):
        trusted_load(src, trust=True)
    sys.path.insert(0, str(tmp_path / "code"))  # the fixture's monkeypatch removes it again


@pytest.mark.parametrize("source", ["mlp_pt2", "mlp_onnx"])
def test_a_route_never_unpickles_a_file_it_wrote(samples, source: str, tmp_path: Path, capsys):
    """``--to torchscript --trust`` from a .pt2 or ONNX file used to write a pickle on the way
    and hand it to torch.load (an internal error): the route needs a model spec instead."""
    out = tmp_path / "o.ts"
    code, body, _ = run_cli(
        [str(samples[source]), "--to", "torchscript", "-o", str(out), "--trust"], capsys
    )
    assert code == 5 and "model_spec" in body["error"]["message"], body
    plan = ptconvert.plan(samples[source], "torchscript", trust=True)
    assert "unpickle_module" not in [e.step for e in plan.edges]


def test_classes_kept_as_hyperparameters_need_trust_not_refusal(tmp_path: Path, capsys) -> None:
    """A Lightning-style checkpoint keeps classes among its hyperparameters (``act=nn.GELU``):
    needs-code (trust constructs classes), not dangerous; with --trust its weights convert."""
    from fixtures.models import MLP

    src = tmp_path / "run.ckpt"
    hparams = {
        "act": torch.nn.GELU,
        "optimizer": torch.optim.AdamW,
        "loss": torch.nn.functional.cross_entropy,  # tensor math: kept as a value, harmless
        "init": torch.nn.init.xavier_uniform_,
        "lr": 1e-3,
    }
    torch.save({"state_dict": MLP().state_dict(), "hyper_parameters": hparams}, src)
    code, body, _ = run_cli(["scan", str(src)], capsys)
    assert body["verdict"] == "needs-code", body
    out = tmp_path / "run.safetensors"
    code, body, _ = run_cli([str(src), "--to", "safetensors", "-o", str(out)], capsys)
    assert code == 11, body
    code, body, _ = run_cli([str(src), "--to", "safetensors", "-o", str(out), "--trust"], capsys)
    assert code == 0 and body["weights"]["verification"]["status"] == "pass", body


def test_a_trainer_output_folder_converts_with_trust_and_nothing_loads_its_pickles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A real Trainer checkpoint folder (training_args.bin with its enums, optimizer.pt,
    rng_state.pth …): needs-code, not dangerous; with --trust its model converts and none of
    those pickles is loaded."""
    import transformers

    config = _tiny_bert_config()
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    rows = [
        {"input_ids": torch.randint(0, 99, (6,)), "labels": torch.tensor(i % 2)} for i in range(4)
    ]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "run"),
        max_steps=1,
        save_steps=1,
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    transformers.Trainer(model=model, args=args, train_dataset=rows).train()
    capsys.readouterr()  # the Trainer's own log lines
    src = tmp_path / "run" / "checkpoint-1"
    assert (src / "training_args.bin").is_file() and (src / "optimizer.pt").is_file()
    code, body, _ = run_cli(["scan", str(src)], capsys)
    assert body["verdict"] == "needs-code", body
    out = tmp_path / "converted"
    code, body, _ = run_cli([str(src), "--to", "safetensors", "-o", str(out)], capsys)
    assert code == 11 and "TrainingArguments" in body["error"]["message"], body
    loaded: list[str] = []
    real_load = torch.load
    monkeypatch.setattr(
        torch, "load", lambda f, *a, **k: loaded.append(str(f)) or real_load(f, *a, **k)
    )
    code, body, _ = run_cli([str(src), "--to", "safetensors", "-o", str(out), "--trust"], capsys)
    assert code == 0 and body["weights"]["verification"]["status"] == "pass", body
    assert loaded == [], loaded
    back = transformers.BertForSequenceClassification.from_pretrained(out)
    assert torch.equal(back.classifier.weight, model.classifier.weight.detach().cpu())


def _tiny_bert_config():
    import transformers

    return transformers.BertConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=37,
        vocab_size=99,
    )


class _TensorAttributeGadget:
    """A tensor rebuilt with ``set_`` = a class in its ``__dict__``, then a BUILD: torch's
    restricted unpickler runs ``inst.set_(*state)`` on a plain Tensor, i.e. ``Effect(marker)``."""

    def __init__(self, cls: type, marker: Path) -> None:
        self.cls, self.marker = cls, marker

    def __reduce__(self):
        import collections

        param = (torch.zeros(2), False, collections.OrderedDict())
        state = collections.OrderedDict(set_=self.cls)
        rebuild = torch._tensor._rebuild_from_type_v2
        args = (torch._utils._rebuild_parameter, torch.Tensor, param, state)
        return (rebuild, args, (str(self.marker),))


def test_a_class_set_as_a_tensor_method_is_refused_by_the_scan_and_at_load(
    net_module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    marker = tmp_path / "EFFECT_RAN"
    src = tmp_path / "gadget.pt"
    torch.save({"w": _TensorAttributeGadget(net_module.Effect, marker)}, src)
    out = tmp_path / "o.ts"
    argv = [str(src), "--to", "torchscript", "-o", str(out), "--trust"]
    code, body, _ = run_cli(argv, capsys)
    assert code == 10 and "tensor it rebuilds" in body["error"]["message"], body
    # a scan made to miss it: the class is kept as a value only, so the load gets a stand-in
    kept = Finding("needs-code", "data.pkl", 0, "GLOBAL", "trustnet.Effect", "imports a module")
    monkeypatch.setattr(guard_module, "_scan", lambda p: FileScan(str(p), "needs-code", [kept], 1))
    # BUILD sets a Tensor's state by Tensor.__setstate__ (the class's), never by the set_ its
    # __dict__ holds: the state does not fit, the load fails, Effect never runs
    with pytest.raises(ptconvert.InputError, match="cannot rebuild"):
        trusted_load(src, trust=True, timeout=None)
    assert not marker.exists() and not out.exists()


def test_a_class_called_with_the_pickles_argument_is_refused_unless_an_enum(
    net_module, tmp_path: Path, capsys
) -> None:
    """``Cls("literal")`` is how an Enum member is pickled, and the scan lets it pass as such;
    a class that is not an Enum is refused at load (its constructor would get the pickle's
    data), and torch's native file writer is dangerous by name."""
    marker = tmp_path / "EFFECT_RAN"
    src = tmp_path / "by_value.pt"
    torch.save({"w": torch.zeros(2), "x": Reduce(net_module.Effect, str(marker))}, src)
    out = tmp_path / "o.ts"
    code, body, _ = run_cli([str(src), "--to", "torchscript", "-o", str(out), "--trust"], capsys)
    assert code == 10 and "runs its __init__" in body["error"]["message"], body
    assert not marker.exists() and not out.exists()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    writer = tmp_path / "writer.pt"
    torch.save({"x": Reduce(torch._C.PyTorchFileWriter, str(victim))}, writer)
    code, body, _ = run_cli(["scan", str(writer)], capsys)
    assert body["verdict"] == "dangerous", body
    assert victim.read_text() == "keep me"


def test_kept_values_come_back_as_themselves_wherever_they_sit(net_module, tmp_path: Path) -> None:
    """Stand-ins are swapped back in shared tuples, ``__slots__``, dict keys; a ``torch.Size``
    stays a ``torch.Size``."""
    relu, gelu = torch.nn.functional.relu, torch._C._nn.gelu
    model = net_module.Net().eval()
    pair = (relu, gelu)
    model.a, model.b = pair, pair
    model.size = torch.Size([2, 3])
    model.table = {torch.nn.GELU: 1.0}
    model.slotted = net_module.Slotted()
    model.slotted.fn = relu
    src = tmp_path / "kept.pt"
    torch.save(model, src)
    loaded = trusted_load(src, trust=True).value
    assert loaded.a == (relu, gelu) and loaded.b == (relu, gelu)
    assert loaded.slotted.fn is relu and list(loaded.table) == [torch.nn.GELU]
    assert type(loaded.size) is torch.Size
