"""AOTInductor packages and ONNX as conversion targets, and ``--optimize``.

Every artifact is loaded by its own reference loader (``aoti_load_package``, an onnxruntime
``InferenceSession``) in a fresh Python process and run at batch 1, 2 and 8 against eager.
AOTInductor compiles native code (tens of seconds): those tests are marked slow.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch

from fixtures.models import MLP, seeded
from tests.conftest import run_cli, swap_step

MLP_ARGS = ["--model", "fixtures.models:MLP", "--input", "x:2x8:float32"]

# run in a fresh interpreter: the artifact's own loader, batch 1, 2 and 8, outputs as JSON lists
_RUN_FRESH = """
import json, sys
import numpy as np
kind, path, inputs, keyword = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
out = {}
for b in (1, 2, 8):
    feeds = {n: np.asarray(v[:b], dtype=dt) for n, (v, dt) in inputs.items()}
    if kind == "onnx":
        import onnxruntime
        sess = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        out[b] = [o.tolist() for o in sess.run(None, feeds)]
    else:
        import torch
        from torch.utils import _pytree as pytree
        runner = torch._inductor.aoti_load_package(path)
        tensors = {k: torch.from_numpy(v) for k, v in feeds.items()}
        res = runner(**tensors) if keyword == "1" else runner(*tensors.values())
        out[b] = [t.tolist() for t in pytree.tree_leaves(res)]
print(json.dumps(out))
"""


def run_fresh(
    kind: str, path: Path, inputs: dict[str, torch.Tensor], keyword: bool = False
) -> dict[int, list[Any]]:
    """Outputs of ``path`` at batch 1, 2 and 8 (the first rows of ``inputs``), computed in a
    new Python process by the format's own runtime (an AOTI package called by keyword when it
    was exported so)."""
    payload = {n: (t.tolist(), str(t.dtype).removeprefix("torch.")) for n, t in inputs.items()}
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_FRESH, kind, str(path), json.dumps(payload), str(int(keyword))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {int(b): v for b, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def assert_matches_eager(kind: str, path: Path) -> None:
    model = seeded(MLP()).eval()
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(3))
    got = run_fresh(kind, path, {"x": x})
    for b in (1, 2, 8):
        torch.testing.assert_close(torch.tensor(got[b][0]), model(x[:b]), rtol=1e-4, atol=1e-5)


def test_a_checkpoint_converts_to_onnx_with_a_named_dynamic_batch(samples, tmp_path, capsys):
    out = tmp_path / "mlp.onnx"
    args = [str(samples["mlp_zip"]), "--to", "onnx", *MLP_ARGS, "--dynamic-batch", "-o", str(out)]
    code, report, _ = run_cli(args, capsys)
    assert code == 0, report
    assert report["route"][-1] == "exported → onnx" and report["check"] == "parity"
    assert [s["batch"] for s in report["parity"]["sizes"]] == [1, 2, 3, 5, 7]
    assert "InferenceSession" in report["interface"]["load"]
    onnx.checker.check_model(str(out), full_check=True)
    model = onnx.load(str(out))
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch_size", 8]  # torch's s77 renamed
    assert [p.name for p in tmp_path.iterdir()] == ["mlp.onnx"]  # no temporary file left
    assert_matches_eager("onnx", out)


NESTED_INPUTS = """
import torch
from torch import nn


class Fuse(nn.Module):
    \"\"\"Features by modality in a dict and extra tensors in a list, as detection and
    multimodal heads take them.\"\"\"

    def __init__(self):
        super().__init__()
        self.image = nn.Linear(4, 4)
        self.text = nn.Linear(6, 4)

    def forward(self, feats: dict[str, torch.Tensor], extra: list[torch.Tensor]):
        return self.image(feats["image"]) + self.text(feats["text"]) + extra[0] * extra[1]


def example_inputs(batch_size):
    g = torch.Generator().manual_seed(batch_size)
    feats = {"image": torch.randn(batch_size, 4, generator=g),
             "text": torch.randn(batch_size, 6, generator=g)}
    return {"feats": feats, "extra": [torch.randn(batch_size, 4, generator=g) for _ in "ab"]}
"""


def test_nested_inputs_are_fed_to_onnxruntime_flattened(tmp_path, capsys):
    """A forward taking a dict and a list of tensors: onnxruntime is fed their leaves under the
    exporter's names (``feats_image``, ``extra_0``), not the nested values."""
    (tmp_path / "fuse.py").write_text(NESTED_INPUTS)
    sys.path.insert(0, str(tmp_path))
    try:
        import fuse  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    torch.save(fuse.Fuse().state_dict(), tmp_path / "w.pt")
    args = [str(tmp_path / "w.pt"), "--to", "onnx", "--model", f"{tmp_path / 'fuse.py'}:Fuse"]
    code, report, _ = run_cli([*args, "-o", str(tmp_path / "f.onnx")], capsys)
    assert code == 0, report
    assert report["parity"]["status"] == "pass"
    names = [i.name for i in onnx.load(str(tmp_path / "f.onnx")).graph.input]
    assert names == ["feats_image", "feats_text", "extra_0", "extra_1"]
    assert not any("scalar inputs" in a for a in report["interface"]["accepts"]), report


def test_onnx_external_data_and_opset(samples, tmp_path, capsys):
    out = tmp_path / "ext.onnx"
    args = [str(samples["mlp_zip"]), "--to", "onnx", *MLP_ARGS, "--dynamic-batch"]
    code, report, _ = run_cli([*args, "--external-data", "--opset", "18", "-o", str(out)], capsys)
    assert code == 0, report
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ext.onnx", "ext.onnx.data"]
    assert any("external data" in n for n in report["notes"])
    model = onnx.load(str(out), load_external_data=False)
    assert {o.domain: o.version for o in model.opset_import}[""] == 18
    locations = {
        kv.value for t in model.graph.initializer for kv in t.external_data if kv.key == "location"
    }
    assert locations == {"ext.onnx.data"}  # named for its final place, not the temporary one
    assert_matches_eager("onnx", out)
    code, info, _ = run_cli(["info", str(out)], capsys)
    assert code == 0 and [f["path"] for f in info["files"]] == [str(out), f"{out}.data"]


def test_onnx_weights_back_to_safetensors_keep_the_torch_names(samples, tmp_path, capsys):
    from safetensors import safe_open

    out = tmp_path / "back.safetensors"
    code, report, _ = run_cli(
        [str(samples["mlp_onnx"]), "--to", "safetensors", "-o", str(out)], capsys
    )
    assert code == 0, report
    assert report["check"] == "bitwise"
    state = seeded(MLP()).state_dict()
    with safe_open(str(out), "pt") as f:
        assert set(f.keys()) == set(state)
        for name in state:
            assert torch.equal(f.get_tensor(name), state[name])


def test_plan_shows_both_routes(samples, capsys):
    for target, last in (("aoti", "aoti_compile"), ("onnx", "onnx_export")):
        code, plan, _ = run_cli(
            ["plan", str(samples["mlp_zip"]), "--to", target, *MLP_ARGS], capsys
        )
        assert code == 0 and plan["runnable"], plan
        assert [s["step"] for s in plan["steps"]] == [
            "read_weights",
            "build_module",
            "export",
            last,
        ]


def test_a_missing_compiler_is_said_before_any_work(samples, tmp_path, capsys, monkeypatch):
    import ptconvert.formats.aoti as aoti

    monkeypatch.setattr(aoti, "compiler", lambda: None)
    started = time.perf_counter()
    out = tmp_path / "m.aoti.pt2"
    code, report, _ = run_cli(
        [str(samples["mlp_zip"]), "--to", "aoti", *MLP_ARGS, "-o", str(out)], capsys
    )
    assert code == 5 and "cpp_compiler" in report["error"]["message"]
    assert "C++ compiler" in report["error"]["hint"]
    assert time.perf_counter() - started < 10 and not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_cuda_without_a_gpu_is_said_before_any_work(samples, tmp_path, capsys):
    args = [str(samples["mlp_zip"]), "--to", "aoti", *MLP_ARGS, "--device", "cuda"]
    code, report, _ = run_cli([*args, "-o", str(tmp_path / "m.aoti.pt2")], capsys)
    assert code == 5 and "CUDA is not available" in report["error"]["message"]
    assert list(tmp_path.iterdir()) == []


def test_verify_with_an_onnx_reference(samples, capsys):
    onnx_file = str(samples["mlp_onnx"])
    for reference, candidate in ((onnx_file, onnx_file), (onnx_file, str(samples["mlp_pt2"]))):
        code, report, _ = run_cli(
            ["verify", reference, candidate, "--input", "x:2x8:float32"], capsys
        )
        assert code == 0 and report["status"] == "pass", report


def test_a_runtime_that_cannot_load_is_a_named_error_at_once(tmp_path):
    from ptconvert.errors import RuntimeDiedError
    from ptconvert.formats.isolated import IsolatedRuntime
    from ptconvert.formats.onnx import runtime as onnx_runtime

    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07\x12\x04junk" + b"\xff" * 64)
    started = time.perf_counter()
    with pytest.raises(RuntimeDiedError, match="onnx runtime cannot load it"):
        IsolatedRuntime("onnx", str(bad), load=onnx_runtime.load, flat=True)
    assert time.perf_counter() - started < 60


def test_a_runtime_that_cannot_load_the_written_file_names_the_users_output(
    samples, tmp_path, capsys, monkeypatch
):
    """The ONNX check loads the file where it was staged (``.net.onnx.xluokcye/net.onnx``): its
    failure named that folder, which the user never sees; it names -o's file now."""
    from ptconvert.errors import RuntimeDiedError
    from ptconvert.formats import FORMATS_BY_NAME

    def refuse(path, device="cpu"):
        raise RuntimeDiedError("the onnx runtime cannot load it: test", path=str(path))

    monkeypatch.setattr(FORMATS_BY_NAME["onnx"], "open", staticmethod(refuse))
    out = tmp_path / "net.onnx"
    code, report, _ = run_cli(
        [str(samples["mlp_zip"]), "--to", "onnx", *MLP_ARGS, "-o", str(out)], capsys
    )
    assert code != 0 and report["error"]["path"] == str(out), report
    assert not out.exists()


def test_a_runtime_whose_process_died_fails_its_next_call_at_once(samples):
    from ptconvert.formats.isolated import IsolatedRuntime
    from ptconvert.formats.onnx import runtime as onnx_runtime

    runtime = IsolatedRuntime("onnx", str(samples["mlp_onnx"]), load=onnx_runtime.load, flat=True)
    (y,) = runtime(x=torch.randn(3, 8))
    assert y.shape == (3, 4)
    runtime._proc.kill()
    runtime._proc.join(5)
    started = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"died|process"):
        runtime(x=torch.randn(3, 8))
    assert time.perf_counter() - started < 10


def test_onnx_info_counts_weights_in_constants_and_subgraphs(tmp_path, capsys):
    """A voice-activity-detector shape: the weights live in Constant nodes inside If branches,
    none in the graph's initializers."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    def branch(name: str, value: float) -> Any:
        weight = numpy_helper.from_array(np.full((64, 64), value, np.float32), f"{name}_w")
        const = helper.make_node("Constant", [], [f"{name}_c"], value=weight)
        mm = helper.make_node("MatMul", ["x", f"{name}_c"], [f"{name}_y"])
        out = helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)
        return helper.make_graph([const, mm], name, [], [out])

    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 64])
    node = helper.make_node(
        "If", ["cond"], ["y"], then_branch=branch("a", 1.0), else_branch=branch("b", 2.0)
    )
    model = helper.make_model(helper.make_graph([node], "vad", [cond, x], [y]))
    path = tmp_path / "vad.onnx"
    onnx.save(model, str(path))
    code, info, _ = run_cli(["info", str(path)], capsys)
    assert code == 0
    assert info["tensors"] == 2 and info["parameters"] == 2 * 64 * 64
    assert info["metadata"]["ops"] == {"If": 1, "Constant": 2, "MatMul": 2}
    assert info["outputs"][0]["shape"] == ["?", 64]  # unknown, not 0
    assert any("Constant nodes or subgraphs" in n for n in info["notes"])


@pytest.mark.slow
def test_a_checkpoint_converts_to_an_aoti_package(samples, tmp_path, capsys):
    out = tmp_path / "mlp.aoti.pt2"
    args = [str(samples["mlp_zip"]), "--to", "aoti", *MLP_ARGS, "--dynamic-batch", "-o", str(out)]
    code, report, _ = run_cli(args, capsys)
    assert code == 0, report
    assert report["route"][-1] == "exported → aoti" and report["check"] == "parity"
    assert any("native code" in n for n in report["notes"])
    assert [p.name for p in tmp_path.iterdir()] == ["mlp.aoti.pt2"]
    assert_matches_eager("aoti", out)
    code, info, _ = run_cli(["info", str(out)], capsys)
    assert info["format"] == "aoti" and info["native_code"]
    code, scan, _ = run_cli(["scan", str(out)], capsys)
    assert code == 11 and scan["verdict"] == "needs-code"


@pytest.mark.slow
def test_optimize_keeps_the_fastest_verified_artifact(samples, tmp_path, capsys):
    out = tmp_path / "best"
    args = [str(samples["mlp_zip"]), "--optimize", *MLP_ARGS, "--dynamic-batch", "-o", str(out)]
    code, report, _ = run_cli(args, capsys)
    assert code == 0, report
    by_runtime = {c["runtime"]: c for c in report["candidates"]}
    assert set(by_runtime) == {"pt2", "aoti", "onnx", "pte", "eager", "torch.compile"}
    verified = [c for c in report["candidates"] if c["check"] == "parity"]
    assert {c["runtime"] for c in verified} == {"pt2", "aoti", "onnx", "pte"}
    kept = [c for c in verified if c["outcome"] == "kept"]
    assert len(kept) == 1 and kept[0]["runtime"] == report["kept"]
    assert kept[0]["vs_eager"] == max(c["vs_eager"] for c in verified)
    assert all(c["median_ms"].keys() == {"1", "8"} for c in report["candidates"])
    from ptconvert import detect

    kept_file = Path(report["output"])  # -o best: the kept format's suffix added (best.onnx)
    assert kept_file.parent == tmp_path and kept_file.name.startswith("best.")
    assert detect(kept_file).format == report["kept"]
    assert [p.name for p in tmp_path.iterdir()] == [kept_file.name]  # the others are gone


def test_torchscript_and_pt2_sources_reach_onnx_under_their_input_names(samples, tmp_path, capsys):
    """TorchScript goes through TS2EPConverter (which names the input x_1) and a .pt2 is
    exported positionally: the ONNX graph takes ``x`` and names its output as eager does."""
    for source, extra in (
        ("mlp_scripted", ["--input", "x:2x8:float32", "--dynamic-batch"]),
        ("mlp_pt2", []),
    ):
        out = tmp_path / f"{source}.onnx"
        code, report, _ = run_cli(
            [str(samples[source]), "--to", "onnx", *extra, "-o", str(out)], capsys
        )
        assert code == 0 and report["check"] == "parity", report
        assert report["interface"]["call"] == 'sess.run(None, {"x": …})'
        model = onnx.load(str(out))
        assert [i.name for i in model.graph.input] == ["x"]
        assert [o.name for o in model.graph.output] == ["output"]
        dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        assert dims == ["batch_size", 8]  # the specialised 8 is a size, not a symbol named "8"
        assert_matches_eager("onnx", out)


def test_a_fixed_batch_onnx_file_is_verified_on_its_declared_inputs(samples, tmp_path, capsys):
    out = tmp_path / "fixed.onnx"
    code, _, _ = run_cli(
        [str(samples["mlp_zip"]), "--to", "onnx", *MLP_ARGS, "-o", str(out)], capsys
    )
    assert code == 0
    # no --input: the graph declares x float32[2, 8], and batch 2 is all it takes
    code, report, _ = run_cli(["verify", str(out), str(samples["mlp_pt2"])], capsys)
    assert code == 0 and report["status"] == "pass" and report["batches"] == [2], report


def test_replacing_an_external_data_model_removes_its_data_file(samples, tmp_path, capsys):
    out = tmp_path / "m.onnx"
    base = [str(samples["mlp_zip"]), "--to", "onnx", *MLP_ARGS, "--dynamic-batch", "-o", str(out)]
    assert run_cli([*base, "--external-data"], capsys)[0] == 0
    assert (tmp_path / "m.onnx.data").exists()
    assert run_cli([*base, "--force"], capsys)[0] == 0
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]
    assert_matches_eager("onnx", out)


def _hf_inputs(example: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    """Token ids (and a mask of ones) of the example's shapes, at batch 8."""
    g = torch.Generator().manual_seed(5)
    return {
        n: torch.ones(8, *shape[1:], dtype=torch.int64)
        if "mask" in n
        else torch.randint(0, 2 if n == "token_type_ids" else 50, (8, *shape[1:]), generator=g)
        for n, shape in example.items()
    }


def _assert_hf_matches(kind: str, directory: Path, out: Path, report: dict[str, Any]) -> None:
    import transformers

    config = json.loads((directory / "config.json").read_text())
    cls = getattr(transformers, (config.get("architectures") or ["AutoModel"])[0])
    model = cls.from_pretrained(directory, attn_implementation="eager").eval()
    inputs = _hf_inputs(report["interface"]["example"])
    got = run_fresh(kind, out, inputs, report["interface"]["keyword"])
    names = report["interface"]["outputs"]
    for b in (1, 2, 8):
        with torch.no_grad():
            want = model(**{k: v[:b] for k, v in inputs.items()}, use_cache=False)
        for name, value in zip(names, got[b], strict=True):
            torch.testing.assert_close(torch.tensor(value), want[name], rtol=1e-4, atol=1e-4)


def test_a_hugging_face_bert_directory_to_onnx(samples, tmp_path, capsys):
    out = tmp_path / "bert.onnx"
    code, report, _ = run_cli(
        [str(samples["hf_bert"]), "--to", "onnx", "--dynamic-batch", "-o", str(out)], capsys
    )
    assert code == 0 and report["check"] == "parity", report
    model = onnx.load(str(out))
    assert [o.name for o in model.graph.output] == report["interface"]["outputs"]
    assert report["interface"]["outputs"] == ["last_hidden_state", "pooler_output"]
    _assert_hf_matches("onnx", samples["hf_bert"], out, report)
    # and back: the initializers carry the checkpoint's own names, not the export wrapper's
    from safetensors import safe_open
    from safetensors.torch import load_file

    back = tmp_path / "bert.safetensors"
    code, weights, _ = run_cli([str(out), "--to", "safetensors", "-o", str(back)], capsys)
    assert code == 0 and weights["check"] == "bitwise", weights
    original = load_file(str(samples["hf_bert"] / "model.safetensors"))
    with safe_open(str(back), "pt") as f:
        assert set(original) <= set(f.keys())
        for name, tensor in original.items():
            assert torch.equal(f.get_tensor(name), tensor), name


@pytest.mark.slow
def test_a_t5_directory_to_onnx_retries_with_eager_attention(samples, tmp_path, capsys):
    out = tmp_path / "t5.onnx"
    code, report, _ = run_cli(
        [str(samples["hf_t5"]), "--to", "onnx", "--dynamic-batch", "-o", str(out)], capsys
    )
    assert code == 0 and report["check"] == "parity", report
    assert any("attn_implementation='eager'" in n for n in report["notes"])
    _assert_hf_matches("onnx", samples["hf_t5"], out, report)


@pytest.mark.slow
def test_hugging_face_and_torchscript_sources_to_aoti(samples, tmp_path, capsys):
    import zipfile

    for source, extra in (
        ("hf_bert", []),
        ("hf_t5", []),
        ("mlp_scripted", ["--input", "x:2x8:float32"]),
    ):
        out = tmp_path / f"{source}.aoti.pt2"
        code, report, _ = run_cli(
            [str(samples[source]), "--to", "aoti", *extra, "--dynamic-batch", "-o", str(out)],
            capsys,
        )
        assert code == 0 and report["check"] == "parity", (source, report)
        # the archive's folder is named after the output, not the temporary file
        assert all(".tmp" not in n for n in zipfile.ZipFile(out).namelist())
        if source == "mlp_scripted":
            assert_matches_eager("aoti", out)
        else:
            _assert_hf_matches("aoti", samples[source], out, report)
    code, report, _ = run_cli(
        ["verify", str(samples["hf_bert"]), str(tmp_path / "hf_bert.aoti.pt2")], capsys
    )
    assert code == 11 and "native code" in report["error"]["message"]


def test_an_onnx_program_that_differs_from_eager_leaves_nothing(
    samples, tmp_path, capsys, monkeypatch
):
    """A wrong ONNX graph is refused (each route tried writes its own staging folder): no
    output, no staging folder, no data file is left."""
    import ptconvert.formats.onnx.edges.export as onnx_export

    real = onnx_export._export
    other = torch.export.export(seeded(MLP(), 7).eval(), (torch.randn(2, 8),))

    def wrong(ep: Any, opts: Any) -> Any:
        return real(other, opts)  # another MLP's weights: runs, computes something else

    monkeypatch.setattr(onnx_export, "_export", wrong)
    out = tmp_path / "out" / "m.onnx"
    args = [str(samples["mlp_zip"]), "--to", "onnx", *MLP_ARGS, "--external-data"]
    code, report, _ = run_cli([*args, "-o", str(out)], capsys)
    assert code == 6 and report["error"]["kind"] == "verification_failed", report
    assert list(out.parent.iterdir()) == []


def test_an_onnx_data_file_is_an_output_like_the_model(samples, tmp_path, capsys):
    out = tmp_path / "m.onnx"
    stray = tmp_path / "m.onnx.data"
    stray.write_bytes(b"someone else's data")
    args = [str(samples["mlp_zip"]), "--to", "onnx", *MLP_ARGS, "-o", str(out)]
    code, report, _ = run_cli(args, capsys)
    assert code == 8 and report["error"]["path"] == str(stray)
    assert stray.read_bytes() == b"someone else's data" and not out.exists()
    # an input of that name is never replaced or removed, even with --force
    source = tmp_path / "weights.onnx.data"
    source.write_bytes(samples["mlp_zip"].read_bytes())
    args = [str(source), "--to", "onnx", *MLP_ARGS, "-o", str(tmp_path / "weights.onnx")]
    code, report, _ = run_cli([*args, "--force"], capsys)
    assert code == 2 and "overwrite the input" in report["error"]["message"]
    assert source.read_bytes() == samples["mlp_zip"].read_bytes()


def test_memory_is_estimated_before_a_program_is_built_and_a_shortfall_refused(
    samples, tmp_path, capsys, monkeypatch
):
    import ptconvert.memory as memory

    code, plan, _ = run_cli(["plan", str(samples["hf_bert"]), "--to", "pt2"], capsys)
    assert code == 0 and plan["memory_estimate_bytes"] > memory.BASE_BYTES
    monkeypatch.setattr(memory, "available_bytes", lambda: 100 * 2**20)  # a small machine
    out = tmp_path / "m.pt2"
    args = [str(samples["mlp_zip"]), "--to", "pt2", *MLP_ARGS, "-o", str(out)]
    code, report, _ = run_cli(args, capsys)
    assert code == 5 and "GiB of memory" in report["error"]["message"]
    assert "--force-memory" in report["error"]["hint"] and not out.exists()
    code, report, _ = run_cli([*args, "--force-memory"], capsys)
    assert code == 0, report
    assert all(s["peak_rss_mib"] > 0 for s in report["steps"])


RATE_MODEL = """
import torch


class WithRate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x, sr: int):
        return self.fc(x) * (sr / 16000)


def make():
    torch.manual_seed(0)
    return WithRate()
"""


def test_the_written_file_is_run_in_a_fresh_process_scalars_included(tmp_path, capsys, monkeypatch):
    """What is compared at every size is the program in memory; the file written is run once
    in a fresh process, a scalar input included, and must give eager's outputs too."""

    (tmp_path / "rate.py").write_text(RATE_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    import rate  # type: ignore[import-not-found]

    torch.save(rate.make().state_dict(), tmp_path / "w.pt")
    args = [str(tmp_path / "w.pt"), "--to", "torchscript", "--model", "rate:make"]
    args += ["--input", "x:2x8:float32", "--input", "sr::int64=16000"]
    code, report, _ = run_cli([*args, "-o", str(tmp_path / "ok.ts")], capsys)
    assert code == 0 and report["check"] == "parity", report

    def tampered(real: Any) -> Any:
        def step(state: Any, opts: Any) -> None:  # the file on disk is another model's
            real(state, opts)
            model = rate.WithRate()
            with torch.no_grad():
                model.fc.weight += 1  # another model's weights, whatever the RNG state
            torch.jit.script(model).save(str(state.output))

        return step

    swap_step(monkeypatch, "script", tampered)
    code, report, _ = run_cli([*args, "-o", str(tmp_path / "bad.ts"), "--no-cache"], capsys)
    # refused by the check (exit 6) whatever the fallback then did (--method auto traces next)
    assert code == 6, report
    message = report["error"]["message"]
    assert "loaded in a fresh process, differs from eager" in message
    # the refused program named beside what stopped the route tried after it
    assert "every route failed" in message and "(refused by the check)" in message
    assert not (tmp_path / "bad.ts").exists()


def test_a_scalar_input_is_never_baked_silently_into_an_aoti_package(tmp_path, capsys, monkeypatch):
    """aoti_load_package's runner drops every non-tensor argument: a package of forward(x, sr)
    returned the example's numbers at any other sr. Refused (exit 4) before compiling; the .pt2
    of the same model refuses another sr by its guard."""
    (tmp_path / "rate.py").write_text(RATE_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    import rate  # type: ignore[import-not-found]

    torch.save(rate.make().state_dict(), tmp_path / "w.pt")
    args = [str(tmp_path / "w.pt"), "--model", "rate:make", "--no-cache"]
    args += ["--input", "x:2x8:float32", "--input", "sr::int64=16000"]
    code, report, _ = run_cli([*args, "--to", "aoti", "-o", str(tmp_path / "r.aoti.pt2")], capsys)
    assert code == 4, report
    assert "sr=16000" in report["error"]["message"], report
    assert not (tmp_path / "r.aoti.pt2").exists()
    code, report, _ = run_cli([*args, "--to", "pt2", "-o", str(tmp_path / "r.pt2")], capsys)
    assert code == 0, report
    program = torch.export.load(tmp_path / "r.pt2").module()
    x = torch.randn(2, 8)
    torch.testing.assert_close(program(x, 16000), rate.make()(x, 16000))
    with pytest.raises(Exception, match="16000"):
        program(x, 8000)


def test_the_memory_estimate_counts_the_weights_read_not_the_optimizer_state(samples, capsys):
    from ptconvert.memory import program_estimate
    from ptconvert.weights.read import read_weights

    ckpt = samples["training_ckpt"]
    code, plan, _ = run_cli(["plan", str(ckpt), "--to", "pt2", *MLP_ARGS], capsys)
    assert code == 0, plan
    weights = sum(e.nbytes for e in read_weights(ckpt).stored)  # the model entry, unwrapped
    assert plan["memory_estimate_bytes"] == program_estimate(weights, copy_runs=False)
    assert weights < ckpt.stat().st_size / 2  # the file is mostly momentum buffers and pickle
