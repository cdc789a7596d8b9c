"""Detection by content and `info` figures, checked against each format's reference loader."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from ptconvert import describe, detect
from tests.conftest import run_cli

EXPECTED = {
    "mlp_zip": ("pt", "zip"),
    "mlp_legacy": ("pt", "legacy"),
    "mlp_tar": ("pt", "tar"),
    "training_ckpt": ("pt", "zip"),
    "raw_pickle": ("pt", "pickle"),
    "cnn_module": ("pt", "zip"),
    "cnn_safetensors": ("safetensors", "single"),
    "block_sharded_safetensors": ("sharded", "safetensors"),
    "block_sharded_bin": ("sharded", "pt"),
    "mlp_scripted": ("torchscript", "zip"),
    "cnn_traced": ("torchscript", "zip"),
    "mlp_pt2": ("pt2", "archive"),
    "mlp_onnx": ("onnx", "protobuf"),
    "hf_bert": ("hf", "directory"),
    "hf_gpt2_bin": ("hf", "directory"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_detects_every_fixture(samples: dict[str, Path], name: str) -> None:
    d = detect(samples[name])
    assert (d.format, d.layout) == EXPECTED[name]


@pytest.mark.parametrize("name", ["mlp_zip", "cnn_safetensors", "mlp_pt2", "mlp_onnx"])
def test_detection_ignores_the_file_name(
    samples: dict[str, Path], name: str, tmp_path: Path
) -> None:
    disguised = tmp_path / "weights.txt"
    shutil.copy(samples[name], disguised)
    assert detect(disguised).format == EXPECTED[name][0]


def _figures(sd: dict[str, torch.Tensor]) -> tuple[int, int, dict[str, int]]:
    """(tensor count, unique parameter count, tensors per dtype) of a state dict."""
    seen, params, hist = set(), 0, {}
    for t in sd.values():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        if key not in seen:
            params += t.numel()
        seen.add(key)
        name = str(t.dtype).removeprefix("torch.")
        hist[name] = hist.get(name, 0) + 1
    return len(sd), params, hist


def _assert_matches(info_path: Path, sd: dict[str, torch.Tensor]) -> None:
    info = describe(info_path)
    count, params, hist = _figures(sd)
    assert info.tensors == count
    assert info.parameters == params
    assert {d: h["tensors"] for d, h in info.dtypes.items()} == hist
    biggest = max(sd.items(), key=lambda kv: (kv[1].numel(), kv[0]))
    assert info.largest[0].numel == biggest[1].numel()
    assert info.largest[0].shape == list(biggest[1].shape)


@pytest.mark.parametrize("name", ["mlp_zip", "mlp_legacy", "training_ckpt"])
def test_checkpoint_info_matches_torch_load(samples: dict[str, Path], name: str) -> None:
    loaded = torch.load(samples[name], weights_only=True)
    flat: dict[str, torch.Tensor] = {}

    def walk(obj: object, prefix: str) -> None:
        if isinstance(obj, torch.Tensor):
            flat[prefix.rstrip(".")] = obj
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{prefix}{k}.")
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{prefix}{i}.")

    walk(loaded, "")
    _assert_matches(samples[name], flat)
    info = describe(samples[name])
    assert set(info.largest[0].name.split(".")) <= set(".".join(flat).split("."))
    assert info.needs_code == []


def test_training_checkpoint_reports_what_else_is_inside(samples: dict[str, Path]) -> None:
    info = describe(samples["training_ckpt"])
    assert set(info.contents) == {"model", "optimizer", "epoch"}
    assert info.contents["epoch"] == "int 3"
    assert "tensors" in info.contents["model"]


def test_legacy_tar_info_matches_torch(samples: dict[str, Path]) -> None:
    # torch refuses weights_only for this layout; the file is our own fixture, so load it fully
    # here to prove the fixture is a real legacy-tar checkpoint.
    sd = torch.load(samples["mlp_tar"], weights_only=False)
    _assert_matches(samples["mlp_tar"], sd)


def test_whole_module_pickle_needs_code(samples: dict[str, Path]) -> None:
    info = describe(samples["cnn_module"])
    assert "fixtures.models.SmallCNN" in info.needs_code
    assert "torch.nn.modules.conv.Conv2d" in info.needs_code
    module = torch.load(samples["cnn_module"], weights_only=False)
    _assert_matches(samples["cnn_module"], module.state_dict())


def test_raw_pickle_contents(samples: dict[str, Path]) -> None:
    info = describe(samples["raw_pickle"])
    assert info.tensors == 0
    assert set(info.contents) == {"mean", "std", "classes"}


def test_safetensors_info_matches_safe_open(samples: dict[str, Path]) -> None:
    from safetensors import safe_open

    path = samples["cnn_safetensors"]
    with safe_open(path, "pt") as f:
        sd = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        metadata = f.metadata()
    _assert_matches(path, sd)
    assert describe(path).metadata == metadata == {"format": "pt", "source": "fixtures"}


@pytest.mark.parametrize("name", ["block_sharded_safetensors", "block_sharded_bin"])
def test_sharded_info_covers_every_shard(samples: dict[str, Path], name: str) -> None:
    import json

    index = samples[name]
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    sd: dict[str, torch.Tensor] = {}
    for shard in shards:
        if shard.endswith(".safetensors"):
            from safetensors.torch import load_file

            sd.update(load_file(index.parent / shard))
        else:
            sd.update(torch.load(index.parent / shard, weights_only=True))
    _assert_matches(index, sd)
    info = describe(index)
    assert info.shards == shards
    assert info.metadata["total_size"] == sum(t.numel() * t.element_size() for t in sd.values())


@pytest.mark.parametrize("name", ["mlp_scripted", "cnn_traced"])
def test_torchscript_info_matches_jit_load(samples: dict[str, Path], name: str) -> None:
    module = torch.jit.load(str(samples[name]))
    sd = dict(module.state_dict())
    _assert_matches(samples[name], sd)
    info = describe(samples[name])
    assert info.inputs is not None and [i.name for i in info.inputs] == [
        a.name for a in module.forward.schema.arguments[1:]
    ]
    assert info.needs_code == []


def test_pt2_info_matches_export_load(samples: dict[str, Path]) -> None:
    ep = torch.export.load(samples["mlp_pt2"])
    _assert_matches(samples["mlp_pt2"], dict(ep.state_dict))
    info = describe(samples["mlp_pt2"])
    assert info.inputs is not None and len(info.inputs) == 1
    batch, features = info.inputs[0].shape or []
    assert isinstance(batch, str) and features == 8  # dim 0 is symbolic
    assert batch in info.metadata["range_constraints"]
    assert info.metadata["range_constraints"][batch]["max_val"] == 64
    assert info.inputs[0].dtype == "float32"
    assert info.outputs is not None and info.outputs[0].shape == [batch, 4]
    assert "aten" in (info.opset or {})


def test_onnx_info_matches_onnx(samples: dict[str, Path]) -> None:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(samples["mlp_onnx"]))
    onnx.checker.check_model(model)
    info = describe(samples["mlp_onnx"])
    assert info.inputs is not None and info.inputs[0].name == "x"
    assert info.inputs[0].shape == ["batch", 8]
    assert info.outputs is not None and info.outputs[0].name == "y"
    assert info.opset is not None and info.opset["ai.onnx"] == model.opset_import[0].version
    arrays = [numpy_helper.to_array(t) for t in model.graph.initializer]
    assert info.parameters == sum(a.size for a in arrays)


@pytest.mark.parametrize("name", ["hf_bert", "hf_gpt2_bin"])
def test_hf_directory_info_matches_from_pretrained(samples: dict[str, Path], name: str) -> None:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(samples[name])
    info = describe(samples[name])
    assert info.metadata["model_type"] == model.config.model_type
    # GPT-2's file holds lm_head tied to the embeddings: the tie counts once, as in transformers
    assert info.parameters == model.num_parameters()
    file_keys = describe(samples[name] / str(info.metadata["weights"])).tensors
    assert info.tensors == file_keys


def test_a_joblib_dump_of_arrays_is_described_not_unparseable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """joblib writes each array's raw bytes inside the pickle stream, after its wrapper: info
    reads the stream as joblib lays it out (it said 'cannot be parsed', exit 3)."""
    joblib = pytest.importorskip("joblib")
    import numpy as np

    src = tmp_path / "stats.joblib"
    joblib.dump({"mean": np.arange(6.0), "labels": np.array([1, 2, 3])}, src)
    code, body, _ = run_cli(["info", str(src)], capsys)
    assert code == 0, body
    assert body["needs_code"] == ["joblib.numpy_pickle.NumpyArrayWrapper"], body
