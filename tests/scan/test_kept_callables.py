"""The --trust issue: a callable of user code kept where torch's rebuild code (or the object it
rebuilds) calls it is dangerous, however deep it sits; classes a file only instantiates stay
needs-code, with the classes named. Each gadget sample really runs its payload when loaded."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fixtures.scan_corpus import FIRES_UNDER, trust_gadgets
from ptconvert.pickles.machine import run_pickle
from ptconvert.scan.analysis import Finding, analyse, verdict
from ptconvert.scan.scanner import scan, scan_file

PLANT = b"cfixtures.scan_corpus\nplant\n"  # a function of user code: needs-code by name
KEPT = "a callable of user code kept where torch may call it"


def judge(data: bytes) -> tuple[str, list[Finding]]:
    findings = analyse(run_pickle(data), "x", frozenset())
    return verdict(findings), findings


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"cbuiltins\ndict\n((lp0\n(Vk\n" + PLANT + b"tp1\natR.", id="dict-argument"),
        pytest.param(b"\x80\x02ccollections\nOrderedDict\n)R(Vk\n" + PLANT + b"u.", id="setitems"),
        pytest.param(b"\x80\x02cbuiltins\nlist\n)R(" + PLANT + b"e.", id="appends"),
        pytest.param(b"\x80\x02cargparse\nNamespace\n)R}Vk\n" + PLANT + b"sb.", id="build-state"),
        pytest.param(b"\x80\x02}Vk\n(" + PLANT + b"\x85lp0\n\x85s.", id="nested-value"),
        pytest.param(
            b"\x80\x02cbuiltins\nset\n)R(" + b"\x80\x02(Vmodule\n" + PLANT + b"NNtQ\x90.",
            id="persistent-id-item",
        ),
    ],
)
def test_a_callable_kept_anywhere_is_dangerous(data: bytes) -> None:
    got, findings = judge(data)
    assert got == "dangerous", findings
    (f,) = [f for f in findings if f.severity == "dangerous"]
    assert f.global_name == "fixtures.scan_corpus.plant" and f.reason.startswith(KEPT)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\x80\x02cfixtures.models\nMLP\n)\x81.", id="newobj"),
        pytest.param(
            b"ccopyreg\n_reconstructor\n(cfixtures.models\nMLP\ncbuiltins\nobject\nNtR.",
            id="reconstructor",
        ),
        # a legacy checkpoint names a whole module's class by a ("module", cls, file, source) id
        pytest.param(b"\x80\x02(Vmodule\ncfixtures.models\nMLP\nNNtQ)\x81.", id="legacy-module-id"),
        # an Enum member pickles as its class called with its value
        pytest.param(b"cfixtures.models\nMLP\n(Vsteps\ntR.", id="enum-member-by-value"),
    ],
)
def test_a_class_only_instantiated_needs_code(data: bytes) -> None:
    got, findings = judge(data)
    assert got == "needs-code", findings
    assert {f.global_name for f in findings} == {"fixtures.models.MLP"}


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(PLANT + b"(V/tmp/x\ntR.", id="function-by-value"),
        pytest.param(b"cfixtures.models\nMLP\n(Vsteps\nVx\ntR.", id="two-arguments"),
        pytest.param(b"cfixtures.models\nMLP\n((lp0\ntR.", id="non-literal"),
    ],
)
def test_a_call_that_is_not_a_member_by_value_is_dangerous(data: bytes) -> None:
    assert judge(data)[0] == "dangerous"


def test_a_functional_enum_with_a_callable_member_is_dangerous() -> None:
    # even an allowlisted callable: the class's _missing_ (or __new__) is what runs
    names = b"(dV_missing_\nccollections\nOrderedDict\ns"
    got, findings = judge(b"cenum\nEnum\n(VE\n" + names + b"tR.")
    assert got == "dangerous" and "Enum class" in findings[-1].reason
    assert judge(b"cenum\nEnum\n(VE\n(dVA\nI1\nstR.")[0] == "clean"  # literal members only


def test_an_attribute_the_load_calls_is_dangerous() -> None:
    """``as_subclass`` set by a rebuild's state: ``_rebuild_from_type_v2`` calls it."""
    state = b"ccollections\nOrderedDict\n)R(Vas_subclass\nccollections\nOrderedDict\nu"
    data = b"\x80\x02ctorch._utils\n_rebuild_parameter_with_state\n(NI00\nN" + state + b"tR."
    got, findings = judge(data)
    assert got == "dangerous" and "as_subclass" in findings[-1].reason


def test_gadget_samples_run_their_payload_under_their_loader(tmp_path: Path) -> None:
    """Every sample the corpus adds for this issue is a real attack: loaded as its maker meant
    (torch.load(weights_only=False), joblib.load or pickle.load; ``torch:member`` is torch.load
    of that file of a folder sample), it creates the marker."""
    marker = tmp_path / "PAYLOAD_RAN"
    paths = trust_gadgets(tmp_path / "samples", marker)
    jobs = []
    for name, path in paths.items():
        loader, _, member = FIRES_UNDER[name].partition(":")
        jobs.append((str(path / member if member else path), loader, name))
    script = textwrap.dedent(
        """
        import json, pathlib, pickle, sys
        import joblib, torch
        marker = pathlib.Path(sys.argv[1])
        fired = {}
        for path, loader, name in json.loads(sys.argv[2]):
            marker.unlink(missing_ok=True)
            try:
                if loader == "torch":
                    torch.load(path, weights_only=False)
                elif loader == "joblib":
                    joblib.load(path)
                else:
                    with open(path, "rb") as fh:
                        pickle.load(fh)
            except Exception:
                pass  # some gadgets fail the load after their payload ran
            fired[name] = marker.exists()
        print(json.dumps(fired))
        """
    )
    cwd = Path(__file__).resolve().parents[2]  # the payload function lives in fixtures/
    done = subprocess.run(
        [sys.executable, "-c", script, str(marker), json.dumps(jobs)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    fired = json.loads(done.stdout.strip().splitlines()[-1])
    assert fired == {name: True for name in paths}


def test_training_args_as_trainer_writes_them_need_code(tmp_path: Path) -> None:
    import torch
    import transformers

    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[])
    torch.save(args, tmp_path / "training_args.bin")
    result = scan_file(tmp_path / "training_args.bin")
    assert result.verdict == "needs-code", [
        f for f in result.findings if f.severity != "needs-code"
    ]
    assert {
        "transformers.training_args.TrainingArguments",
        "transformers.trainer_utils.IntervalStrategy",
        "transformers.trainer_utils.SchedulerType",
    } <= set(result.classes)


def test_a_joblib_file_is_read_as_joblib_lays_it_out(tmp_path: Path) -> None:
    """The array bytes after each wrapper are skipped (an object array's pickle is run): the
    file needs joblib's wrapper class, and nothing in it fails to parse."""
    import joblib
    import numpy as np

    labels = np.array(["a", None], dtype=object)
    joblib.dump({"labels": labels, "w": np.arange(12.0).reshape(3, 4), "n": 3}, tmp_path / "m.pkl")
    result = scan_file(tmp_path / "m.pkl")
    assert result.verdict == "needs-code", result.findings
    assert result.classes == ["joblib.numpy_pickle.NumpyArrayWrapper"]
    structured = np.zeros(2, dtype=[("a", "f4"), ("b", "i8")])
    joblib.dump(structured, tmp_path / "s.pkl")  # its layout is not checked: refused, not passed
    assert scan_file(tmp_path / "s.pkl").verdict == "error"


def test_python_source_is_code_and_the_pickle_its_bytes_make(tmp_path: Path) -> None:
    """A .py that an auto_map imports is code (needs-code); torch.load of the same file
    unpickles it from byte 0, so a payload its bytes make as a pickle is dangerous. Real source
    fails at once as a pickle; source nothing imports is no model file at all."""
    source = tmp_path / "modeling_x.py"
    source.write_text("import torch\n\n\nclass XModel(torch.nn.Module):\n    pass\n")
    result = scan_file(source)
    assert result.verdict == "clean" and not result.model  # nothing imports it
    config = {"auto_map": {"AutoModel": "modeling_x.XModel"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = scan_file(source)
    assert result.verdict == "needs-code" and result.pickles == 0 and result.model
    (f,) = result.findings
    assert f.member == str(source) and "Python source" in f.reason
    source.write_bytes(b"\x80\x02cposix\nsystem\n(Vtouch x\ntR.")
    result = scan_file(source)
    assert result.verdict == "dangerous" and result.pickles == 1
    (f,) = [f for f in result.findings if f.severity == "dangerous"]
    assert f.global_name == "posix.system" and f.member.endswith("(read as a pickle from byte 0)")


def test_auto_map_names_the_code_and_its_classes(tmp_path: Path) -> None:
    (tmp_path / "modeling_x.py").write_text("class XModel: pass\n")
    auto_map = {
        "AutoConfig": "configuration_x.XConfig",
        "AutoModel": "modeling_x.XModel",
        "AutoTokenizer": ["tokenization_x.XTokenizer", None],
        "AutoModelForCausalLM": "other/repo--modeling_y.YModel",
    }
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "x", "auto_map": auto_map}))
    report = scan([tmp_path])
    assert report.verdict == "needs-code"
    config = next(f for f in report.files if f.path.endswith("config.json"))
    assert config.classes == [
        "configuration_x.XConfig",
        "modeling_x.XModel",
        "modeling_y.YModel",
        "tokenization_x.XTokenizer",
    ]
    reasons = " ".join(f.reason for f in config.findings)
    assert "modeling_x.py, in this folder" in reasons and "'other/repo'" in reasons
    source = next(f for f in report.files if f.path.endswith(".py"))
    assert source.verdict == "needs-code"
