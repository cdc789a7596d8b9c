"""A folder scan as CI runs it (issue 44): the files a loader reads, decided by their content;
``.py`` files only when a config's auto_map imports them; --include/--exclude globs."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from ptconvert.scan.scanner import scan, scan_file
from tests.conftest import run_cli

PAYLOAD = b"\x80\x02cposix\nsystem\n(Vtouch x\ntR."  # never run: the scanner reads opcodes
PROTO0 = b"cposix\nsystem\n(S'touch x'\ntR."  # protocol 0: text that is a pickle


def _state_dict(path: Path) -> None:
    import torch

    torch.save({"w": torch.zeros(2, 3)}, path)


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    """A plain model folder: weights, configs, tokenizer files, a README, logs, a script."""
    import numpy as np
    from safetensors.numpy import save_file

    root = tmp_path / "model"
    (root / "logs").mkdir(parents=True)
    _state_dict(root / "pytorch_model.bin")
    save_file({"w": np.zeros((2, 3), np.float32)}, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    (root / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    (root / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0}}}))
    (root / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    (root / "README.md").write_text("# A model\n\nsee train.py\n")
    (root / "train.py").write_text("import torch\n\nprint('training')\n")
    (root / ".gitattributes").write_text("*.bin filter=lfs diff=lfs merge=lfs -text\n")
    for i in range(3):
        (root / "logs" / f"run{i}.log").write_text("step 1 loss 0.5\n" * 40)
    return root


def test_a_plain_model_folder_is_clean_and_lists_only_model_files(
    model_folder: Path, capsys
) -> None:
    code, body, _ = run_cli(["scan", str(model_folder)], capsys)
    assert code == 0 and body["verdict"] == "clean", body
    listed = sorted(Path(f["path"]).name for f in body["files"])
    assert listed == ["model.safetensors", "pytorch_model.bin"]
    skipped = sorted(Path(p).name for p in body["skipped"])
    assert "train.py" in skipped and "README.md" in skipped and "run0.log" in skipped
    assert len(skipped) == 10


def test_content_decides_not_the_suffix(model_folder: Path) -> None:
    """A pickle renamed .txt (binary or protocol-0 text), a torch zip named .log, a pickle
    payload named .py that nothing imports: each is read as what it is."""
    (model_folder / "notes.txt").write_bytes(PAYLOAD)
    (model_folder / "logs" / "run9.log").write_bytes(PROTO0)
    _state_dict(model_folder / "weights.log")
    (model_folder / "helper.py").write_bytes(PAYLOAD)
    report = scan([model_folder])
    by_name = {Path(f.path).name: f for f in report.files}
    assert by_name["notes.txt"].verdict == "dangerous"
    assert by_name["run9.log"].verdict == "dangerous"
    assert by_name["helper.py"].verdict == "dangerous"
    assert by_name["weights.log"].verdict == "clean" and by_name["weights.log"].pickles == 1
    assert report.verdict == "dangerous"


def test_an_archive_without_pickles_is_a_model_file(tmp_path: Path) -> None:
    import numpy as np

    np.savez(tmp_path / "arrays.npz", a=np.zeros(3))
    with zipfile.ZipFile(tmp_path / "docs.zip", "w") as z:
        z.writestr("a.txt", "hello")
    report = scan([tmp_path])
    assert sorted(Path(f.path).name for f in report.files) == ["arrays.npz", "docs.zip"]
    assert report.verdict == "clean"


def test_python_source_counts_only_when_auto_map_imports_it(model_folder: Path) -> None:
    """auto_map names modeling_x.py; it imports .layers relatively (transformers copies and
    imports that too); train.py is imported by nothing."""
    config = {"model_type": "x", "auto_map": {"AutoModel": "modeling_x.XModel"}}
    (model_folder / "config.json").write_text(json.dumps(config))
    (model_folder / "modeling_x.py").write_text("from .layers import Block\nclass XModel: ...\n")
    (model_folder / "layers.py").write_text("class Block: ...\n")
    report = scan([model_folder])
    code = {Path(f.path).name: f for f in report.files if f.verdict == "needs-code"}
    assert sorted(code) == ["config.json", "layers.py", "modeling_x.py"]
    assert "config.json names modeling_x.XModel" in code["modeling_x.py"].findings[0].reason
    assert "modeling_x.py imports it" in code["layers.py"].findings[0].reason
    assert str(model_folder / "train.py") in report.skipped
    alone = scan_file(model_folder / "train.py")
    assert alone.verdict == "clean" and not alone.model


def test_include_and_exclude_select_files_by_glob(model_folder: Path, capsys) -> None:
    (model_folder / "logs" / "evil.bin").write_bytes(PAYLOAD)
    code, body, _ = run_cli(["scan", str(model_folder), "--exclude", "logs/*"], capsys)
    assert code == 0, body
    code, body, _ = run_cli(["scan", str(model_folder), "--include", "*.bin"], capsys)
    assert code == 10, body
    assert sorted(Path(f["path"]).name for f in body["files"]) == ["evil.bin", "pytorch_model.bin"]
    argv = ["scan", str(model_folder), "--include", "*.bin", "--exclude", "evil.*"]
    code, body, _ = run_cli(argv, capsys)
    assert code == 0 and [Path(f["path"]).name for f in body["files"]] == ["pytorch_model.bin"]


def test_torch_classes_are_named_as_torch_not_user_code(tmp_path: Path) -> None:
    """A whole pickled nn.Module still needs trust to load (needs-code), but its classes are
    torch's own, not user code."""
    import torch

    torch.save(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.GELU()), tmp_path / "m.pt")
    result = scan_file(tmp_path / "m.pt")
    assert result.verdict == "needs-code"
    assert "torch.nn.modules.linear.Linear" in result.classes
    for f in result.findings:
        assert "user code" not in f.reason, f
    imports = [f.reason for f in result.findings if f.opcode == "GLOBAL"]
    assert imports and all("a class of torch itself" in why for why in imports)


def test_the_gate_sees_a_py_file_become_code_when_a_config_names_it(tmp_path: Path) -> None:
    """The guard caches a scan per file version: a config that starts importing a .py file
    changes that file's verdict, though its own bytes did not change."""
    from ptconvert.errors import NeedsTrustError
    from ptconvert.scan.guard import guard

    (tmp_path / "handler.py").write_text("print('serving')\n")
    _state_dict(tmp_path / "pytorch_model.bin")
    guard(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"auto_map": {"AutoModel": "handler.H"}}))
    with pytest.raises(NeedsTrustError, match=r"handler\.py"):
        guard(tmp_path)


def test_an_onnx_file_without_external_data_is_scanned_without_importing_onnx(
    tmp_path: Path,
) -> None:
    """Importing onnx takes about a second: a model that names no external file (no
    ``location`` key anywhere in it) needs no parse to say it reads none."""
    import subprocess
    import sys

    from fixtures.scan_corpus import _onnx_external, _pb

    inline = _pb(1, 4) + _pb(2, 1) + _pb(8, b"w") + _pb(9, bytes(16))  # raw_data in the file
    graph = _pb(1, _pb(1, b"w") + _pb(2, b"y") + _pb(4, b"Identity")) + _pb(5, inline)
    model = _pb(1, 8) + _pb(2, b"test") + _pb(7, graph) + _pb(8, _pb(2, 17))
    (tmp_path / "model.onnx").write_bytes(model)
    (tmp_path / "escape").mkdir()
    (tmp_path / "escape" / "model.onnx").write_bytes(_onnx_external("../secret.bin"))
    probe = (
        "import sys; from ptconvert.scan.scanner import scan_file\n"
        f"r = scan_file({str(tmp_path / 'model.onnx')!r})\n"
        "print(r.verdict, 'onnx' in sys.modules)\n"
        f"print(scan_file({str(tmp_path / 'escape' / 'model.onnx')!r}).verdict)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["clean", "False", "dangerous"], out


def test_a_folder_scan_imports_nothing_it_does_not_use(model_folder: Path) -> None:
    """Start-up is most of a folder scan's time (issue 44: within 2x picklescan): the scan of
    a plain model folder imports no ML library and none of the process machinery that
    conversions use."""
    import subprocess
    import sys

    probe = (
        "import sys\nfrom ptconvert.cli import main\n"
        f"code = main(['scan', {str(model_folder)!r}, '--json'])\n"
        "print(code, *sorted(sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    code, *modules = out.stdout.split("\n")[-2].split()
    assert code == "0", out.stdout[-2000:]
    heavy = {"torch", "numpy", "onnx", "transformers", "multiprocessing", "concurrent.futures"}
    assert not heavy & set(modules)


def test_a_file_named_is_listed_whatever_it_holds(model_folder: Path) -> None:
    """Skipping is for the files a folder holds: a file named on the command line is the
    user's question, answered in the listing."""
    readme = model_folder / "README.md"
    report = scan([readme, model_folder / "logs"])
    assert [f.path for f in report.files] == [str(readme)] and report.files[0].verdict == "clean"
    assert len(report.skipped) == 3


@pytest.mark.parametrize("text", [b"x = 1\nprint(x)\n", b"x y z\n"])
def test_text_opening_like_a_zlib_header_with_a_dictionary_is_not_a_stream(
    tmp_path: Path, text: bytes
) -> None:
    """``x `` (0x78 0x20) passes zlib's header check with FDICT set: a stream no loader can
    decompress (it needs a preset dictionary). A script starting ``x = 1`` was an error, exit 3;
    it is read from byte 0 as torch.load would, and skipped as no loader's file."""
    (tmp_path / "helper.py").write_bytes(text)
    report = scan([tmp_path])
    assert report.verdict == "clean", report
    import zlib

    (tmp_path / "x.bin").write_bytes(zlib.compress(PAYLOAD))  # a real stream is still opened
    assert scan([tmp_path]).verdict == "dangerous"
