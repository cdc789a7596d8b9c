"""``--trust`` cannot be turned into code execution (issue 38): a trusted load rebuilds the
classes it admits by the default mechanism, refuses classes whose rebuild runs their own code
unless ``--allow`` names them, stops what ``--allow`` lets run at the audit hook of the process
it loads in, imports no ``__main__`` module and ends within ``--load-timeout``."""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import ptconvert
from fixtures.trust_corpus import (
    OWN_CODE,
    EvaluatesText,
    call_into_samples,
    looping_sample,
    own_code_samples,
)
from ptconvert.scan import guard as guard_module
from ptconvert.scan.admission import own_code
from ptconvert.scan.analysis import Finding
from ptconvert.scan.scanner import FileScan
from ptconvert.scan.trusted_load import trusted_load
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]
INPUT = ["--input", "input:1x2:float32"]
# sample → the class whose own code it relies on
OWNER = {
    "own_new_sequential.pt": "fixtures.trust_corpus.EvaluatesText",
    "own_setstate_state_dict.pt": "fixtures.trust_corpus.RunsItsState",
    "own_setstate_legacy.pt": "fixtures.trust_corpus.RunsItsState",
    "own_setitem_sequential.pt": "fixtures.trust_corpus.StoresByCode",
    "own_del_sequential.pt": "fixtures.trust_corpus.Finalizes",
}
# samples whose class --trust admits and whose load refuses what the file does with it
REFUSED_AT_LOAD = {
    "own_hash_key_sequential.pt": ("fixtures.trust_corpus.HashesByCode", "as a key"),
    "reduce_after_newobj_sequential.pt": (
        "fixtures.trust_corpus.TouchesOnInit",
        "runs its __init__",
    ),
}


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], Path]:
    marker = tmp_path_factory.mktemp("own-marker") / "PAYLOAD_RAN"
    return own_code_samples(tmp_path_factory.mktemp("own"), marker), marker


def _children() -> list[int]:
    """Live processes of this one's but multiprocessing's resource tracker (it lives as long
    as the test process)."""
    return [
        pid
        for pid in _children_of(os.getpid())
        if b"resource_tracker" not in _cmdline(pid) and b"forkserver" not in _cmdline(pid)
    ]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_every_sample_runs_its_payload_under_plain_torch_load(own, tmp_path: Path) -> None:
    """The samples are real attacks: ``torch.load(weights_only=False)`` runs each payload."""
    paths, _ = own
    marker = tmp_path / "FIRED"
    fresh = own_code_samples(tmp_path / "fresh", marker)
    script = textwrap.dedent(
        """
        import json, pathlib, sys, torch
        marker, fired = pathlib.Path(sys.argv[1]), {}
        for name, path in json.loads(sys.argv[2]).items():
            marker.unlink(missing_ok=True)
            try:
                value = torch.load(path, weights_only=False)
                del value
            except Exception:
                pass
            fired[name] = marker.exists()
        print(json.dumps(fired))
        """
    )
    jobs = json.dumps({n: str(p) for n, p in fresh.items()})
    out = subprocess.run(
        [sys.executable, "-c", script, str(marker), jobs],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    fired = json.loads(out.stdout.strip().splitlines()[-1])
    assert fired == {n: True for n in paths}, fired


@pytest.mark.parametrize("name", sorted(OWNER))
def test_trust_refuses_a_class_whose_rebuild_runs_its_own_code(
    own, name: str, tmp_path: Path, capsys
) -> None:
    paths, marker = own
    src, cls = str(paths[name]), OWNER[name]
    code, body, _ = run_cli(["scan", src], capsys)
    assert body["verdict"] == "needs-code", body
    out = tmp_path / "out.pt2"
    code, body, _ = run_cli([src, "--to", "pt2", "-o", str(out), "--trust", *INPUT], capsys)
    error = body["error"]
    assert code == 11 and cls in error["message"], body
    assert all(h in error["message"] for h in OWN_CODE[cls]), error
    assert f"--allow {cls}" in error["hint"], error
    assert not marker.exists() and not out.exists()


@pytest.mark.parametrize("name", sorted(REFUSED_AT_LOAD))
def test_trust_refuses_what_the_file_does_with_an_admitted_class(
    own, name: str, tmp_path: Path, capsys
) -> None:
    """HashesByCode is admitted (its own __hash__ runs only if an instance is a key) but the
    file makes one a dict key; TouchesOnInit is admitted but the file calls it by REDUCE."""
    paths, marker = own
    out = tmp_path / "out.pt2"
    argv = [str(paths[name]), "--to", "pt2", "-o", str(out), "--trust", *INPUT]
    code, body, _ = run_cli(argv, capsys)
    assert code == 10 and REFUSED_AT_LOAD[name][1] in body["error"]["message"], body
    assert not marker.exists() and not out.exists()


@pytest.mark.parametrize("name", sorted([*OWNER, "own_hash_key_sequential.pt"]))
def test_allow_lets_its_code_run_only_up_to_the_audit_hook(
    own, name: str, tmp_path: Path, capsys
) -> None:
    """``--allow`` admits the class by its own code, in the probe's process first: the payload
    raises an audit event there, the load stops, exit 10 names it, nothing is written."""
    paths, marker = own
    out = tmp_path / "out.pt2"
    cls = {**OWNER, **{n: c for n, (c, _) in REFUSED_AT_LOAD.items()}}[name]
    argv = [str(paths[name]), "--to", "pt2", "-o", str(out), "--trust", "--allow", cls]
    code, body, _ = run_cli([*argv, *INPUT], capsys)
    assert code == 10 and "audit event" in body["error"]["message"], body
    assert not marker.exists() and not out.exists() and _children() == []


def test_the_audit_hook_names_the_event_and_the_class(own, tmp_path: Path, capsys) -> None:
    paths, marker = own
    cls = "fixtures.trust_corpus.EvaluatesText"
    argv = [str(paths["own_new_sequential.pt"]), "--to", "torchscript", "-o", str(tmp_path / "o")]
    code, body, _ = run_cli([*argv, "--allow", cls, "--trust", *INPUT], capsys)
    assert code == 10, body
    assert "'compile'" in body["error"]["message"] and cls in body["error"]["message"]
    assert not marker.exists()


def test_an_allowlisted_call_never_calls_into_an_instance(tmp_path: Path, capsys) -> None:
    """``str(obj)``, ``PurePosixPath(obj)`` of an admitted class's instance would run its
    ``__str__``/``__fspath__``: refused at load (exit 10); under torch.load the payload runs."""
    marker = tmp_path / "PAYLOAD_RAN"
    samples = call_into_samples(tmp_path / "samples", marker)
    for name, path in samples.items():
        out = tmp_path / f"{name}.pt2"
        argv = [str(path), "--to", "pt2", "-o", str(out), "--trust", *INPUT]
        code, body, _ = run_cli(argv, capsys)
        assert code == 10 and "would call into it" in body["error"]["message"], (name, body)
        assert not marker.exists() and not out.exists()
    for path in samples.values():
        torch.load(path, weights_only=False)  # the test's own fixtures: a real attack
        assert marker.exists(), path
        marker.unlink()


def test_a_load_that_never_ends_is_stopped_at_the_limit(tmp_path: Path, capsys) -> None:
    src = looping_sample(tmp_path)
    out = tmp_path / "out.pt2"
    argv = [str(src), "--to", "pt2", "-o", str(out), "--allow", "fixtures.trust_corpus.Loops"]
    started = time.monotonic()
    code, body, _ = run_cli([*argv, "--trust", "--load-timeout", "4", *INPUT], capsys)
    assert code == 3 and "--load-timeout" in body["error"]["message"], body
    assert body["error"]["path"] == str(src)
    assert time.monotonic() - started < 60
    assert not out.exists() and _children() == []


def test_a_load_probe_dies_with_its_parent(tmp_path: Path) -> None:
    """A ptconvert killed while its probe spins leaves no process behind."""
    src = looping_sample(tmp_path)
    argv = [sys.executable, "-m", "ptconvert", str(src), "--to", "pt2", "-o", str(tmp_path / "o")]
    argv += ["--trust", "--allow", "fixtures.trust_corpus.Loops", "--load-timeout", "600", *INPUT]
    parent = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    probe = None
    deadline = time.monotonic() + 90
    while probe is None and time.monotonic() < deadline:
        time.sleep(0.5)
        spawned = [p for p in _children_of(parent.pid) if b"spawn_main" in _cmdline(p)]
        probe = next(iter(spawned), None)
    assert probe is not None, "the probe never started"
    time.sleep(2)  # spinning in the load by now
    kids = _children_of(parent.pid)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while any(_state(k) != "Z" for k in kids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert {k: _state(k) for k in kids} == {k: "Z" for k in kids}


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return "Z"


def _children_of(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            kids.append(int(stat.parent.name))
    return kids


def test_a_main_module_is_never_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan calls a ``pkg.__main__`` global dangerous; a scan made to miss it still does not
    get the module imported by the load (importing it runs the package's command line)."""
    src = tmp_path / "main.pkl"
    src.write_bytes(b"\x80\x02cpygments.__main__\nFormatter\n)\x81.")
    assert ptconvert.scan([src]).verdict == "dangerous"
    kept = Finding("needs-code", "main.pkl", 0, "NEWOBJ", "pygments.__main__.Formatter", "x")
    monkeypatch.setattr(guard_module, "_scan", lambda p: FileScan(str(p), "needs-code", [kept], 1))
    with pytest.raises(ptconvert.UnsafeInputError, match="__main__"):
        trusted_load(src, trust=True, timeout=None)
    assert "pygments.__main__" not in sys.modules


def test_admission_by_mechanism() -> None:
    """Classes real models are made of rebuild by the default mechanism; classes with hooks of
    their own are named with them."""
    import sympy
    import transformers

    modules = [getattr(torch.nn, n) for n in dir(torch.nn)]
    layers = [c for c in modules if isinstance(c, type) and issubclass(c, torch.nn.Module)]
    assert len(layers) > 100 and {c.__name__: own_code(c) for c in layers if own_code(c)} == {}
    for cls in (
        transformers.BertModel,
        transformers.GPT2LMHeadModel,
        transformers.GPT2Config,
        transformers.GenerationConfig,  # its own __hash__/__eq__: checked where keys are stored
    ):
        assert own_code(cls) == [], cls

    class Color(enum.Enum):
        RED = 1

    @dataclasses.dataclass(frozen=True)
    class Hparams:
        lr: float = 0.1

    point = collections.namedtuple("point", "x y")
    for cls in (Color, Hparams, point, collections.OrderedDict):
        assert own_code(cls) == [], cls
    assert "__new__" in own_code(sympy.Order) and "__new__" in own_code(EvaluatesText)
    for dotted, hooks in OWN_CODE.items():
        module, _, name = dotted.rpartition(".")
        assert own_code(getattr(sys.modules[module], name)) == hooks


@pytest.mark.parametrize("legacy", [False, True])
def test_a_pickled_model_of_torch_layers_converts_with_trust(
    legacy: bool, tmp_path: Path, capsys
) -> None:
    """Benign stays benign: nn.Sequential of torch layers (zip and legacy layouts) is rebuilt,
    converts, and computes what torch.load's own model computes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8),
        torch.nn.LayerNorm(8),
        torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True),
        torch.nn.GELU(),
    ).eval()
    src = tmp_path / "seq.pt"
    torch.save(model, src, _use_new_zipfile_serialization=not legacy)
    out = tmp_path / "seq.pt2"
    argv = [str(src), "--to", "pt2", "-o", str(out), "--trust", "--input", "input:2x3x8:float32"]
    code, body, _ = run_cli(argv, capsys)
    assert code == 0 and body["parity"]["status"] == "pass", body
    x = torch.randn(2, 3, 8)
    assert torch.allclose(torch.export.load(out).module()(x), model(x), atol=1e-5)


def test_trusted_loads_in_threads_each_keep_their_own_policy(tmp_path: Path) -> None:
    """Two trusted loads at once (a pipeline's threads): each unpickler resolves through its own
    load's table, never the other's."""
    from concurrent.futures import ThreadPoolExecutor

    torch.manual_seed(0)
    paths = []
    for i, layer in enumerate([torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)]):
        paths.append(tmp_path / f"m{i}.pt")
        torch.save(torch.nn.Sequential(layer, torch.nn.ReLU()), paths[-1])
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda p: trusted_load(p, trust=True, timeout=None).value, paths * 4))
    x = torch.randn(2, 4)
    for path, model in zip(paths * 4, got, strict=True):
        assert torch.equal(model(x), torch.load(path, weights_only=False)(x)), path


HOSTILE_CLASSES = """
import pathlib
MARK = pathlib.Path({marker!r})

class Rep:
    def __repr__(self):
        MARK.touch()
        return "Rep"

class GA:
    def __getattribute__(self, name):
        MARK.touch()
        return object.__getattribute__(self, name)

class Meta(type):
    def __repr__(cls):
        MARK.touch()
        return "K"

class K(metaclass=Meta):
    pass

class Tr:
    def train(self, mode=True):
        MARK.touch()
        return self
"""


class _Reduced:
    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return (self.func, self.args)


@pytest.fixture
def hostile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A module of classes whose ordinary methods (``__repr__``, ``__getattribute__``, a
    metaclass's, ``train``) create the marker: no hook admission looks at."""
    code = tmp_path / "code"
    code.mkdir()
    marker = tmp_path / "MARK"
    (code / "hostilemod.py").write_text(HOSTILE_CLASSES.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(code))
    import hostilemod  # type: ignore[import-not-found]

    yield hostilemod, marker
    sys.modules.pop("hostilemod", None)


def test_values_reach_no_method_of_the_files_classes(hostile, tmp_path: Path) -> None:
    """From a review: an instance hidden in a deque given to ``str``, a class with its own
    metaclass given to ``str``, a stand-in beside an instance with its own ``__getattribute__``
    (the swap after the load walked it with getattr), a submodule that is no nn.Module (``eval``
    calls its ``train``): each refused or walked without calling the class."""
    import torch.nn.functional as F

    mod, marker = hostile
    rep = object.__new__(mod.Rep)
    cases = {
        "deque_str": _Reduced(str, collections.deque([rep])),
        "meta_str": _Reduced(str, mod.K),
        "swap_getattribute": [object.__new__(mod.GA), F.relu],
    }
    net = torch.nn.Module()
    net.__dict__["_modules"]["x"] = object.__new__(mod.Tr)
    cases["foreign_submodule"] = net
    outcomes = {}
    for name, obj in cases.items():
        src = tmp_path / f"{name}.pt"
        torch.save(obj, src)
        marker.unlink(missing_ok=True)  # pickling GA here went through its __getattribute__
        try:
            value = trusted_load(src, trust=True, timeout=None).value
            if isinstance(value, torch.nn.Module):
                value.eval()
            outcomes[name] = "loaded"
        except ptconvert.UnsafeInputError:
            outcomes[name] = "refused"
        assert not marker.exists(), name
    assert outcomes == {
        "deque_str": "refused",
        "meta_str": "refused",
        "swap_getattribute": "loaded",
        "foreign_submodule": "refused",
    }


def test_a_metaclass_is_never_constructed(tmp_path: Path) -> None:
    """NEWOBJ of torch's own ``_ParameterMeta`` would build a class from the pickle's namespace
    (its ``__set_name__``, ``__init_subclass__``; the legacy loader then writes a .patch file
    named by it): a metaclass is not admitted."""
    assert own_code(torch.nn.parameter._ParameterMeta)[-1].startswith("a metaclass")
    meta = b"ctorch.nn.parameter\n_ParameterMeta\n"
    data = b"\x80\x04" + meta + b"(VX\n)}t}\x92."
    src = tmp_path / "meta.pt"
    import zipfile

    with zipfile.ZipFile(src, "w") as z:
        z.writestr("archive/data.pkl", data)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
    with pytest.raises(ptconvert.NeedsTrustError, match="_ParameterMeta"):
        trusted_load(src, trust=True, timeout=None)


def test_a_pickled_generative_model_loads_with_trust(tmp_path: Path) -> None:
    """A whole pickled LlamaForCausalLM carries a GenerationConfig (its own __hash__ and
    __eq__, never used as a key): rebuilt under --trust, computing what the model computes."""
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=99,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    src = tmp_path / "llama.pt"
    torch.save(model, src)
    loaded = trusted_load(src, trust=True, timeout=None)
    assert loaded.warnings == []
    ids = torch.randint(0, 99, (2, 5))
    assert torch.equal(loaded.value(ids).logits, model(ids).logits)
