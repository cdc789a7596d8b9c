"""Every registered format is complete: it has a sample the tests build, is detected as itself,
is described as its golden says, and its weights or its program check out against the reference
the format's own library gives.

Generic over ``FORMATS``: each test is parametrized by format name, so a newly registered format
gets its parameters at once and fails until it has its line in ``SAMPLES`` (how its sample is
built, what it was built from, its reference loader) and its golden,
``tests/formats/golden/<name>.json``. ``PTCONVERT_UPDATE_GOLDENS=1`` rewrites the goldens of the
formats that run (``-m 'not fuzz'`` for the slow samples' too); review the diff before committing.
"""

from __future__ import annotations

import difflib
import inspect
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from fixtures.build import MLP_INPUT
from fixtures.models import MLP, seeded
from ptconvert import convert, describe, detect
from ptconvert.formats import FORMATS, FORMATS_BY_NAME

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("PTCONVERT_UPDATE_GOLDENS") == "1"

Tensors = dict[str, torch.Tensor]


# -- reference loaders: each format's tensors as its own library reads them


def load_pt(path: Path) -> Tensors:
    state = torch.load(path, weights_only=True, map_location="cpu")
    return dict(state)


def load_safetensors(path: Path) -> Tensors:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is no dict)


def load_sharded(index: Path) -> Tensors:
    """Every shard the index names, by the reference loader of the shard's own format."""
    weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
    tensors: Tensors = {}
    for shard in sorted(set(weight_map.values())):
        part = index.parent / shard
        tensors.update(load_safetensors(part) if shard.endswith(".safetensors") else load_pt(part))
    assert sorted(tensors) == sorted(weight_map), "the shards hold what the index maps"
    return tensors


def load_torchscript(path: Path) -> Tensors:
    return dict(torch.jit.load(str(path), map_location="cpu").state_dict())


def load_pt2(path: Path) -> Tensors:
    return dict(torch.export.load(str(path)).state_dict)


def load_onnx(path: Path) -> Tensors:
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    return {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in graph.initializer}


def load_hf(folder: Path) -> Tensors:
    """The model class ``config.json`` names, loaded by transformers' ``from_pretrained``."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    model_class = getattr(transformers, config.architectures[0])
    return dict(model_class.from_pretrained(folder).state_dict())


def load_gguf(path: Path) -> Tensors:
    """gguf's GGUFReader: plain types as they are, quantized blocks by ``gguf.quants.dequantize``
    (float32); torch's shape is GGUF's dims reversed."""
    import gguf
    import numpy as np

    tensors: Tensors = {}
    for t in gguf.GGUFReader(path).tensors:
        shape = [int(d) for d in reversed(t.shape.tolist())]
        plain = t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
        data = t.data if plain else gguf.quants.dequantize(t.data, t.tensor_type)
        tensors[t.name] = torch.from_numpy(np.ascontiguousarray(data).reshape(shape).copy())
    return tensors


# -- samples: one per format, built by fixtures/build.py or by a session fixture below


@dataclass(frozen=True)
class Sample:
    """A format's sample and what it is checked against.

    ``source``: a key of ``fixtures.build.build_all`` (the session's ``samples``), or with
    ``fixture`` the name of a session fixture of this module returning the sample's path (a
    sample that takes more than a second to build, then ``slow``, or one a package of its own
    writes). ``reference``: the format's own library reading its tensors (every format that
    reads weights has one). ``model``/``inputs``: for a program, the eager model it was built
    from and its example inputs."""

    source: str
    reference: Callable[[Path], Tensors] | None = None
    model: Callable[[], torch.nn.Module] | None = None
    inputs: tuple[torch.Tensor, ...] = ()
    slow: bool = False  # built or run past the fast suite's budget: `pytest -m slow` runs it
    needs: str = ""  # a package the sample needs: its tests skip without it
    fixture: bool = False  # ``source`` names a session fixture of this module


def mlp() -> torch.nn.Module:
    """The MLP fixtures/build.py saves its programs from (before the training step)."""
    return seeded(MLP())


SAMPLES: dict[str, Sample] = {
    "pt": Sample("mlp_zip", load_pt),
    "safetensors": Sample("cnn_safetensors", load_safetensors),
    "sharded": Sample("block_sharded_safetensors", load_sharded),
    "torchscript": Sample("mlp_scripted", load_torchscript, mlp, MLP_INPUT),
    "pt2": Sample("mlp_pt2", load_pt2, mlp, MLP_INPUT),
    "aoti": Sample("aoti_sample", None, mlp, MLP_INPUT, slow=True, fixture=True),
    "onnx": Sample("mlp_onnx", load_onnx, mlp, MLP_INPUT, needs="onnx"),
    "hf": Sample("hf_bert", load_hf, needs="transformers"),
    "pte": Sample("pte_sample", None, mlp, MLP_INPUT, slow=True, needs="executorch", fixture=True),
    "gguf": Sample("gguf_sample", load_gguf, needs="gguf", fixture=True),
}


@pytest.fixture(scope="session")
def aoti_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MLP compiled by AOTInductor (Inductor's C++ compile: slow)."""
    out = tmp_path_factory.mktemp("registry-aoti") / "mlp.pt2"
    ep = torch.export.export(mlp(), MLP_INPUT)
    return Path(torch._inductor.aoti_compile_and_package(ep, package_path=str(out)))


@pytest.fixture(scope="session")
def pte_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MLP lowered by ExecuTorch on its portable kernels, as tests/formats/test_pte.py
    lowers it (about 5 s)."""
    from executorch.exir import to_edge_transform_and_lower

    out = tmp_path_factory.mktemp("registry-pte") / "mlp.pte"
    program = to_edge_transform_and_lower(torch.export.export(mlp(), MLP_INPUT)).to_executorch()
    out.write_bytes(program.buffer)
    return out


@pytest.fixture(scope="session")
def gguf_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GGUF written by gguf's GGUFWriter (llama.cpp's converters' writer): an architecture
    transformers does not map (its tensors keep their GGUF names), a float32, a float16 and a
    Q8_0 tensor."""
    import gguf
    import numpy as np

    path = tmp_path_factory.mktemp("registry-gguf") / "tiny.gguf"
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    writer = gguf.GGUFWriter(path, arch="registrytest")
    writer.add_name("registry sample")
    writer.add_tensor("blk.0.w.f32", x)
    writer.add_tensor("blk.0.w.f16", x[:2].astype(np.float16))
    q8 = gguf.GGMLQuantizationType.Q8_0
    writer.add_tensor("blk.0.w.q8_0", gguf.quants.quantize(x, q8), raw_dtype=q8)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def missing_sample(name: str) -> str:
    return (
        f"format {name!r} has no sample: add SAMPLES[{name!r}] in tests/formats/test_registry.py "
        "(a key of fixtures/build.py's build_all when the sample builds in under a second, else "
        "a session fixture of that module, fixture=True, slow=True when it takes more), its "
        "reference loader when it reads weights and the model it was built from when it is a "
        "program; then write "
        f"tests/formats/golden/{name}.json with PTCONVERT_UPDATE_GOLDENS=1"
    )


def params(formats: list[str]) -> list[Any]:
    """Format names as parameters, those whose sample is slow marked so."""
    return [
        pytest.param(n, marks=pytest.mark.slow) if n in SAMPLES and SAMPLES[n].slow else n
        for n in formats
    ]


ALL = [f.name for f in FORMATS]
# weights formats ptconvert both reads and writes: a round trip through each other one
WRITERS = [f.name for f in FORMATS if f.reads_weights and f.writes_weights]
# formats whose weights ptconvert reads but does not write: checked against their own loader
READ_ONLY = [f.name for f in FORMATS if f.reads_weights and not f.writes_weights]
PROGRAMS = [f.name for f in FORMATS if f.kind == "program"]


@dataclass
class Built:
    path: Path
    root: Path  # the folder it was built in: "<samples>" in the goldens


def sample_of(name: str, request: pytest.FixtureRequest) -> Built:
    spec = SAMPLES.get(name)
    if spec is None:
        pytest.fail(missing_sample(name), pytrace=False)
    if spec.needs:
        pytest.importorskip(spec.needs)
    if spec.fixture:
        path = Path(request.getfixturevalue(spec.source))
        return Built(path, path.parent)
    samples: dict[str, Path] = request.getfixturevalue("samples")
    assert spec.source in samples, f"{name}: fixtures/build.py builds no {spec.source!r}"
    root = Path(os.path.commonpath([str(p) for p in samples.values()]))
    return Built(samples[spec.source], root)


# -- 1. a sample for every format


@pytest.mark.parametrize("name", ALL)
def test_every_format_has_a_sample(name: str) -> None:
    assert name in SAMPLES, missing_sample(name)
    spec, fmt = SAMPLES[name], FORMATS_BY_NAME[name]
    if fmt.reads_weights:
        assert spec.reference is not None, f"{name} reads weights: give its reference loader"
    if fmt.kind == "program":
        assert spec.model is not None and spec.inputs, (
            f"{name} is a program format: give the eager model its sample was built from and "
            "the sample's example inputs"
        )
    assert (GOLDEN / f"{name}.json").exists() or UPDATE, (
        f"no golden for {name}: run PTCONVERT_UPDATE_GOLDENS=1 pytest "
        f"tests/formats/test_registry.py -m 'not fuzz' -k {name} and review the file"
    )


def test_no_sample_or_golden_of_an_unregistered_format() -> None:
    stale = sorted(set(SAMPLES) - set(ALL))
    assert not stale, f"SAMPLES has entries for formats no longer registered: {stale}"
    goldens = sorted(p.stem for p in GOLDEN.glob("*.json") if p.stem not in ALL)
    assert not goldens, f"goldens of formats no longer registered: {goldens}"


# -- 2. detection and the `info` golden

# values that depend on the versions of the libraries that wrote the sample, or on the machine,
# not on ptconvert: their keys stay (losing one is a regression), their values are masked.
# "*" matches any key or list index.
VOLATILE: dict[tuple[str, ...], str] = {
    ("metadata", "producer"): "<producer version>",  # onnx: "pytorch 2.13.0+cpu"
    ("metadata", "ir_version"): "<version>",  # onnx: the exporter's IR version
    ("metadata", "schema_version"): "<version>",  # pt2: torch's export schema
    ("opset", "*"): "<version>",  # the exporter's operator sets (onnx; pt2's aten)
    ("metadata", "target", "AOTI_CPU_ISA"): "<machine>",  # aoti: the compiling machine
    ("metadata", "target", "AOTI_PLATFORM"): "<machine>",
    ("metadata", "target", "AOTI_MACHINE"): "<machine>",
}
# files whose bytes are a function of their tensors alone keep their size: every other file
# (torch's zips and pickles, configs, programs) records the versions that wrote it
STABLE_SIZE = re.compile(r"\.safetensors$|\.index\.json$")
# lists whose order says nothing
UNORDERED = {"files", "shards", "globals", "needs_code", "native_code", "notes"}
# a dim torch names (s0, s77, u3): its number changes with torch's hashing, not with the file
SYMBOL = re.compile(r"^[su]\d+$")
# a compiled artifact's content hash in its file name (an AOTInductor wrapper library)
HASH = re.compile(r"\b[a-z0-9]{40,}\b")


def matches(pattern: tuple[str, ...], at: tuple[str, ...]) -> bool:
    return len(pattern) == len(at) and all(p in ("*", a) for p, a in zip(pattern, at, strict=True))


def normalise(info: dict[str, Any], root: Path) -> dict[str, Any]:
    """``info --json`` as it is on every machine, in every run and with every version of the
    libraries that wrote the sample (see VOLATILE, STABLE_SIZE, UNORDERED, SYMBOL)."""
    roots = sorted({str(root), str(root.resolve())}, key=len, reverse=True)

    def text(s: str) -> str:
        for r in roots:
            s = s.replace(r, "<samples>")
        return HASH.sub("<hash>", s)

    def walk(value: Any, at: tuple[str, ...]) -> Any:
        marker = next((m for p, m in VOLATILE.items() if matches(p, at)), None)
        if marker is not None:
            return marker
        if isinstance(value, dict):
            return {text(k): walk(v, (*at, k)) for k, v in value.items()}
        if isinstance(value, list):
            items = [walk(v, (*at, str(i))) for i, v in enumerate(value)]
            if len(at) == 1 and at[0] in UNORDERED:
                items.sort(key=lambda v: json.dumps(v, sort_keys=True))
            return items
        return text(value) if isinstance(value, str) else value

    out: dict[str, Any] = walk(info, ())
    stable = True
    for entry in out["files"]:
        if not STABLE_SIZE.search(entry["path"]):
            entry["size_bytes"], stable = "<varies>", False
    if not stable or not out["files"]:
        out["size_bytes"] = "<varies>"
    return rename_symbols(out)


def rename_symbols(info: dict[str, Any]) -> dict[str, Any]:
    """Torch's dim symbols renamed s0, s1, … in the order they first appear."""
    names: dict[str, str] = {}

    def find(value: Any) -> None:
        if isinstance(value, dict):
            for k in sorted(value):
                find(k)
                find(value[k])
        elif isinstance(value, list):
            for v in value:
                find(v)
        elif isinstance(value, str) and SYMBOL.match(value):
            names.setdefault(value, f"s{len(names)}")

    def swap(value: Any) -> Any:
        if isinstance(value, dict):
            return {names.get(k, k): swap(v) for k, v in value.items()}
        if isinstance(value, list):
            return [swap(v) for v in value]
        return names.get(value, value) if isinstance(value, str) else value

    find(info)
    result: dict[str, Any] = swap(info)
    return result


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def golden_diff(name: str, got: dict[str, Any]) -> str:
    """The unified diff from the golden to ``got`` ("" when they agree)."""
    want = (GOLDEN / f"{name}.json").read_text()
    return "".join(
        difflib.unified_diff(
            want.splitlines(keepends=True),
            dumps(got).splitlines(keepends=True),
            f"tests/formats/golden/{name}.json",
            f"ptconvert info --json (normalised) of the {name} sample",
        )
    )


# fields whose loss the goldens must catch, and what losing each looks like
REGRESSIONS: dict[str, Any] = {
    "tensors": None,
    "parameters": None,
    "dtypes": {},
    "largest": [],
    "metadata": {},
    "shards": [],
    "inputs": None,
    "outputs": None,
    "opset": None,
    "contents": {},
    "globals": [],
    "native_code": [],
}


@pytest.mark.parametrize("name", params(ALL))
def test_detected_and_described_as_its_golden(name: str, request: pytest.FixtureRequest) -> None:
    built = sample_of(name, request)
    assert detect(built.path).format == name
    info = json.loads(describe(built.path).to_json())
    assert info["format"] == name
    got = normalise(info, built.root)
    path = GOLDEN / f"{name}.json"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(dumps(got))
    elif not path.exists():
        pytest.fail(f"no golden {path}: run with PTCONVERT_UPDATE_GOLDENS=1 and review it")
    diff = golden_diff(name, got)
    if diff:
        pytest.fail(
            f"`ptconvert info` of the {name} sample changed (PTCONVERT_UPDATE_GOLDENS=1 rewrites "
            f"the golden when the change is intended):\n{diff}",
            pytrace=False,
        )
    # the normalisation keeps what a regression would lose: each such loss differs from it
    for field, lost in REGRESSIONS.items():
        if info[field] != lost:
            assert golden_diff(name, normalise({**info, field: lost}, built.root)), field


def test_the_normalisation_masks_only_what_varies(tmp_path: Path) -> None:
    """Paths, version strings, machine and file sizes that vary are masked; counts are not."""
    info = {
        "path": f"{tmp_path}/m.onnx",
        "size_bytes": 10,
        "files": [
            {"path": f"{tmp_path}/b.safetensors", "size_bytes": 7},
            {"path": f"{tmp_path}/a.json", "size_bytes": 3},
        ],
        "tensors": 4,
        "metadata": {"producer": "pytorch 2.13.0", "nodes": 3},
        "opset": {"ai.onnx": 20},
        "inputs": [{"name": "x", "dtype": "float32", "shape": ["s77", 8]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": ["s77", "s12"]}],
        "native_code": ["m/data/aotinductor/model/" + "c" * 52 + ".wrapper.so"],
        "notes": ["b", "a"],
    }
    assert normalise(info, tmp_path) == {
        "path": "<samples>/m.onnx",
        "size_bytes": "<varies>",
        "files": [
            {"path": "<samples>/a.json", "size_bytes": "<varies>"},
            {"path": "<samples>/b.safetensors", "size_bytes": 7},
        ],
        "tensors": 4,
        "metadata": {"producer": "<producer version>", "nodes": 3},
        "opset": {"ai.onnx": "<version>"},
        "inputs": [{"name": "x", "dtype": "float32", "shape": ["s0", 8]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": ["s0", "s1"]}],
        "native_code": ["m/data/aotinductor/model/<hash>.wrapper.so"],
        "notes": ["a", "b"],
    }


# -- 3. weights round trips and programs against their references


def assert_same_tensors(got: Tensors, want: Tensors, what: str) -> None:
    """Same names, dtypes, shapes and bytes."""
    assert sorted(got) == sorted(want), f"{what}: other tensor names"
    for key, expected in want.items():
        actual = got[key]
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), f"{what}: {key}"
        as_bytes = [
            t.detach().contiguous().reshape(-1).view(torch.uint8) for t in (actual, expected)
        ]
        assert torch.equal(*as_bytes), f"{what}: {key} differs"


def reference_of(name: str) -> Callable[[Path], Tensors]:
    spec = SAMPLES.get(name)
    if spec is None:
        pytest.fail(missing_sample(name), pytrace=False)
    assert spec.reference is not None, f"{name} reads weights: give its reference loader"
    return spec.reference


@pytest.mark.parametrize("name", params(WRITERS))
def test_weights_round_trip_through_every_other_writer(
    name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    built = sample_of(name, request)
    original = reference_of(name)(built.path)
    fmt = FORMATS_BY_NAME[name]
    others = [n for n in WRITERS if n != name]
    assert others, "a weights format to round-trip through"
    for other in others:
        there = tmp_path / f"there{FORMATS_BY_NAME[other].suffix}"
        back = tmp_path / f"back-from-{other}{fmt.suffix}"
        convert(built.path, other, there)
        assert_same_tensors(reference_of(other)(there), original, f"{name} → {other}")
        convert(there, name, back)
        assert_same_tensors(reference_of(name)(back), original, f"{name} → {other} → {name}")


@pytest.mark.parametrize("name", params(READ_ONLY))
def test_weights_read_as_its_own_loader_reads_them(
    name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    built = sample_of(name, request)
    out = tmp_path / "weights.safetensors"
    convert(built.path, "safetensors", out)
    assert_same_tensors(load_safetensors(out), reference_of(name)(built.path), name)


def outputs(value: Any) -> list[torch.Tensor]:
    """A program's outputs as a flat list of tensors."""
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in outputs(v)]
    return [torch.as_tensor(value)]


@pytest.mark.parametrize("name", params(PROGRAMS))
def test_program_runs_as_the_eager_model(name: str, request: pytest.FixtureRequest) -> None:
    built = sample_of(name, request)
    spec = SAMPLES[name]
    assert spec.model is not None and spec.inputs, f"{name}: the eager model and its inputs"
    model = spec.model().eval()
    names = list(inspect.signature(model.forward).parameters)[: len(spec.inputs)]
    with torch.no_grad():
        want = outputs(model(*spec.inputs))
    program = FORMATS_BY_NAME[name].open(built.path)
    try:
        got = outputs(program.call(**dict(zip(names, spec.inputs, strict=True))))
    finally:
        program.close()
    assert len(got) == len(want), f"{name}: {len(got)} outputs, the model gives {len(want)}"
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
