"""What a written artifact holds besides the model (issue #29): no path of the converting
machine (stack traces, source locations) unless ``--keep-debug-info``, tied weights once, and
an ONNX file not much bigger than its weights."""

from __future__ import annotations

import site
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

import onnx
import pytest

import ptconvert
from tests.conftest import run_cli

REPO = Path(__file__).resolve().parents[2]


def machine_paths(*more: Path) -> set[str]:
    """Absolute paths of this machine a file could leak: home, the project, the venv and its
    site-packages, the temporary folder, the test's own folder."""
    found = {str(Path.home()), str(REPO), sys.prefix, sysconfig.get_paths()["purelib"]}
    found |= {*site.getsitepackages(), tempfile.gettempdir() + "/", *(str(p) for p in more)}
    return {p for p in found if len(p) > 4}  # "/" or "/tmp" alone could be any bytes


def leaks(blobs: list[bytes], paths: set[str]) -> dict[str, int]:
    counts = {p: sum(b.count(p.encode()) for b in blobs) for p in paths}
    return {p: n for p, n in counts.items() if n}


def zip_members(path: Path) -> list[bytes]:
    with zipfile.ZipFile(path) as z:
        return [z.read(name) for name in z.namelist()]


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small BERT whose weights outweigh its graph (as a real model's do): 0.5 MB."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    directory = tmp_path_factory.mktemp("hygiene") / "bert"
    BertModel(config).eval().save_pretrained(directory)
    return directory


def test_an_onnx_file_holds_no_path_of_this_machine_and_little_beside_its_weights(
    bert, tmp_path, capsys
):
    out = tmp_path / "bert.onnx"
    ptconvert.convert(bert, "onnx", out, dynamic_batch=True)  # checked against eager too
    paths = machine_paths(bert, tmp_path)
    assert leaks([out.read_bytes()], paths) == {}
    model = onnx.load(str(out))
    assert not [p.key for n in model.graph.node for p in n.metadata_props]
    weights = sum(len(t.raw_data) for t in model.graph.initializer)
    assert out.stat().st_size <= 1.1 * weights  # torch's debug metadata was 5× the weights

    kept = tmp_path / "kept.onnx"
    code, _, _ = run_cli(
        [str(bert), "--to", "onnx", "-o", str(kept), "--keep-debug-info", "--no-verify"], capsys
    )
    assert code == 0
    assert leaks([kept.read_bytes()], paths)  # the stack traces name this machine's files


def test_a_pt2_archive_holds_no_path_of_this_machine(bert, tmp_path, capsys):
    out = tmp_path / "bert.pt2"
    report = ptconvert.convert(bert, "pt2", out, dynamic_batch=True)
    assert report.check == "parity"
    paths = machine_paths(bert, tmp_path)
    assert leaks(zip_members(out), paths) == {}

    kept = tmp_path / "kept.pt2"
    code, _, _ = run_cli(
        [str(bert), "--to", "pt2", "-o", str(kept), "--keep-debug-info", "--no-verify"], capsys
    )
    assert code == 0
    assert leaks(zip_members(kept), paths)


def test_a_tied_embedding_is_one_initializer_in_onnx(tmp_path):
    """GPT-2's lm_head is its token embedding: the ONNX file holds those bytes once."""
    import torch
    from transformers import GPT2LMHeadModel

    from fixtures.build import _tiny_gpt2_config

    torch.manual_seed(0)
    directory = tmp_path / "gpt2"
    GPT2LMHeadModel(_tiny_gpt2_config()).eval().save_pretrained(directory)
    out = tmp_path / "gpt2.onnx"
    ptconvert.convert(directory, "onnx", out, verify=False)
    state = GPT2LMHeadModel.from_pretrained(directory).state_dict()
    embedding = state["transformer.wte.weight"]
    model = onnx.load(str(out))
    shaped = [t for t in model.graph.initializer if list(t.dims) == list(embedding.shape)]
    constants = [n for n in model.graph.node if n.op_type == "Constant"]
    assert len(shaped) == 1 and not any(
        len(a.t.raw_data) >= embedding.numel() * 4 for n in constants for a in n.attribute
    )
    unique = {t.data_ptr(): t.numel() * t.element_size() for t in state.values()}
    assert sum(len(t.raw_data) for t in model.graph.initializer) <= sum(unique.values())


@pytest.mark.slow  # AOTInductor compiles native code (about a minute)
def test_an_aoti_library_carries_no_debug_sections(bert, tmp_path):
    """The shared library is compiled without DWARF line tables (g++ -g1), which name every
    source and header by its absolute path (two thirds of a small package's bytes). What
    stays, and is not stripped yet: the generated .cpp files end with Inductor's compile
    command as a comment, and the library holds the headers' __FILE__ names."""
    out = tmp_path / "bert.aoti.pt2"
    ptconvert.convert(bert, "aoti", out, verify=False)
    with zipfile.ZipFile(out) as z:
        libraries = [z.read(n) for n in z.namelist() if n.endswith(".so")]
    assert libraries and not any(b".debug_" in lib for lib in libraries)


# -o: an existing folder or a trailing "/" takes the default name inside it, a program's missing
# suffix is added (said in a note), a Hugging Face directory's weights to NAME.safetensors are
# one file


@pytest.fixture()
def checkpoint(tmp_path: Path) -> Path:
    import torch

    from fixtures.models import MLP, seeded

    path = tmp_path / "model.bin"
    torch.save(seeded(MLP()).state_dict(), path)
    return path


def test_a_program_without_its_suffix_gets_it(checkpoint, tmp_path):
    import torch

    report = ptconvert.convert(checkpoint, "safetensors", tmp_path / "weights.st")
    assert report.output == str(tmp_path / "weights.st")  # weights: the name given
    spec = {"model": "fixtures.models:MLP", "inputs": ["x:2x8:float32"], "verify": False}
    pt2_report = ptconvert.convert(checkpoint, "pt2", tmp_path / "prog.out", **spec)
    assert pt2_report.output == str(tmp_path / "prog.out.pt2")  # torch.export.load needs it
    assert any("lacks the pt2 suffix" in n for n in pt2_report.notes)
    torch.export.load(tmp_path / "prog.out.pt2")
    # onnxruntime and torch.jit.load take any name: the name given is kept
    onnx_report = ptconvert.convert(checkpoint, "onnx", tmp_path / "opt.out", **spec)
    assert onnx_report.output == str(tmp_path / "opt.out")
    onnx.checker.check_model(str(tmp_path / "opt.out"))


def test_an_output_folder_takes_the_default_name(checkpoint, tmp_path, capsys):
    existing = tmp_path / "existing"
    existing.mkdir()
    report = ptconvert.convert(checkpoint, "safetensors", existing)
    assert report.output == str(existing / "model.safetensors")
    code, out, _ = run_cli([str(checkpoint), "--to", "pt", "-o", f"{existing}/"], capsys)
    assert code == 0 and out["output"] == str(existing / "model.pt")


def test_a_hugging_face_directory_to_a_named_file_or_a_folder(tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import BertModel

    from fixtures.build import _tiny_bert_config

    torch.manual_seed(0)
    directory = tmp_path / "bert"
    BertModel(_tiny_bert_config()).eval().save_pretrained(directory)
    single = ptconvert.convert(directory, "safetensors", tmp_path / "weights.safetensors")
    assert (tmp_path / "weights.safetensors").is_file()
    assert any("written alone" in n for n in single.notes)
    assert set(load_file(str(tmp_path / "weights.safetensors"))) == set(
        load_file(str(directory / "model.safetensors"))
    )
    ptconvert.convert(directory, "safetensors", tmp_path / "copy")  # no suffix: the folder
    assert (tmp_path / "copy" / "config.json").is_file()


def test_a_model_from_code_alone_takes_the_suffix_rule(tmp_path, monkeypatch, capsys):
    """No SRC (``--model pkg:make --to pt2 -o net``): the program's suffix is added as with a
    source, said in a note; the name skipped the rule before."""
    import torch

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "net"
    args = ["--model", "fixtures.models:MLP", "--to", "pt2", "--input", "x:2x8:float32"]
    code, report, _ = run_cli([*args, "-o", str(out), "--no-verify"], capsys)
    assert code == 0, report
    assert report["output"] == str(tmp_path / "net.pt2") and not out.exists()
    assert any("lacks the pt2 suffix" in n for n in report["notes"])
    torch.export.load(tmp_path / "net.pt2")


def test_optimize_names_the_kept_artifact_by_the_same_rule(checkpoint, tmp_path, monkeypatch):
    """``--optimize -o opt.out`` wrote the kept ONNX as ``opt.out``: -o without the kept
    format's suffix gets it (api._output_name's rule, one function), said in the report. Only
    the ONNX candidate runs here (AOTInductor compiles for a minute)."""
    from ptconvert.convert import optimize as optimize_module

    monkeypatch.setattr(optimize_module, "targets", lambda: ["onnx"])
    spec = {"model": "fixtures.models:MLP", "inputs": ["x:2x8:float32"]}
    report = ptconvert.optimize(checkpoint, tmp_path / "opt.out", repeats=2, warmup=1, **spec)
    assert report.kept == "onnx" and report.output == str(tmp_path / "opt.out.onnx")
    assert any("lacks the onnx suffix" in n for n in report.notes)
    assert not (tmp_path / "opt.out").exists()
    onnx.checker.check_model(str(tmp_path / "opt.out.onnx"))
    named = ptconvert.optimize(checkpoint, tmp_path / "named.onnx", repeats=2, warmup=1, **spec)
    assert named.output == str(tmp_path / "named.onnx") and not named.notes
