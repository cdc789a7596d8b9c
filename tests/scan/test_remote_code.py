"""A Hugging Face directory whose ``auto_map`` names its own code: the scan says so, a
conversion needs ``--trust-remote-code`` (transformers imports, so runs, that code; ``--trust``
alone does not grant it) and says it ran."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli

CONFIG_SOURCE = """
from transformers import PretrainedConfig

class TinyConfig(PretrainedConfig):
    model_type = "tiny-remote"

    def __init__(self, hidden=8, **kw):
        self.hidden = hidden
        super().__init__(**kw)
"""
MODELING_SOURCE = """
import pathlib
import torch
from transformers import PreTrainedModel
from .configuration_tiny import TinyConfig

pathlib.Path({marker!r}).touch()  # the directory's code ran


class TinyModel(PreTrainedModel):
    config_class = TinyConfig

    def __init__(self, config):
        super().__init__(config)
        self.fc = torch.nn.Linear(config.hidden, config.hidden)
        self.post_init()

    def forward(self, x):
        return self.fc(x)
"""


@pytest.fixture
def remote_code_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A directory as ``save_pretrained`` writes it for classes registered for an Auto class:
    config.json with ``auto_map``, the weights, and the two code files beside them."""
    import importlib

    marker = tmp_path / "CODE_RAN"
    package = tmp_path / "src" / "tinyremote"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "configuration_tiny.py").write_text(CONFIG_SOURCE)
    (package / "modeling_tiny.py").write_text(MODELING_SOURCE.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    config_mod = importlib.import_module("tinyremote.configuration_tiny")
    model_mod = importlib.import_module("tinyremote.modeling_tiny")
    config_mod.TinyConfig.register_for_auto_class()
    model_mod.TinyModel.register_for_auto_class("AutoModel")
    torch.manual_seed(0)
    model_mod.TinyModel(config_mod.TinyConfig()).save_pretrained(tmp_path / "hf")
    marker.unlink()
    for name in list(sys.modules):
        if name.startswith("tinyremote"):
            sys.modules.pop(name)
    return tmp_path / "hf", marker


def test_a_directory_with_auto_map_needs_trust_remote_code_and_says_its_code_runs(
    remote_code_dir: tuple[Path, Path], tmp_path: Path, capsys
) -> None:
    src, marker = remote_code_dir
    assert (src / "modeling_tiny.py").is_file()
    code, body, _ = run_cli(["scan", str(src)], capsys)
    assert body["verdict"] == "needs-code", body
    out = tmp_path / "tiny.pt2"
    argv = [str(src), "--to", "pt2", "-o", str(out), "--input", "x:2x8:float32"]
    code, body, _ = run_cli(argv, capsys)
    assert code == 11 and "modeling_tiny.TinyModel" in body["error"]["message"], body
    assert not marker.exists() and not out.exists()
    code, body, _ = run_cli([*argv, "--trust"], capsys)  # trust in pickles is not this grant
    error = body["error"]
    assert code == 11 and "--trust-remote-code" in error["hint"], body
    assert "modeling_tiny.py" in error["message"] and "modeling_tiny.TinyModel" in error["message"]
    assert "configuration_tiny.TinyConfig" in error["message"]
    assert not marker.exists() and not out.exists()
    code, body, _ = run_cli([*argv, "--trust-remote-code"], capsys)
    assert code == 0, body
    assert marker.exists()  # trusted: transformers imported the directory's code
    assert any("own code ran" in n for n in body["notes"]), body["notes"]
    assert body["parity"]["status"] == "pass"
    program = torch.export.load(out).module()  # called by keyword, as transformers models are
    x = torch.randn(2, 8)
    got = program(x=x)
    got = next(iter(got.values())) if isinstance(got, dict) else got
    assert got.shape == (2, 8)


def test_python_source_that_nothing_imports_does_not_need_trust(
    samples, tmp_path: Path, capsys
) -> None:
    """A folder's .py file that no auto_map imports is run by no loader (issue 44): the
    conversion needs no grant. Once an auto_map names it, it is code: refused without
    --trust-remote-code, the message names the file."""
    import json
    import shutil

    src = tmp_path / "bert"
    shutil.copytree(samples["hf_bert"], src)
    (src / "handler.py").write_text("print('serving')\n")
    out = tmp_path / "out"
    code, body, _ = run_cli([str(src), "--to", "safetensors", "-o", str(out)], capsys)
    assert code == 0, body
    config = json.loads((src / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "handler.Handler"}
    (src / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out2"
    code, body, _ = run_cli([str(src), "--to", "safetensors", "-o", str(out)], capsys)
    assert code == 11 and "handler.py" in body["error"]["message"], body
    assert "--trust-remote-code" in body["error"]["hint"] and not out.exists()


def test_remote_code_that_does_not_build_is_a_named_error(
    remote_code_dir: tuple[Path, Path], tmp_path: Path, capsys
) -> None:
    """The directory's model class skips post_init(): transformers raises an AttributeError
    while loading it; that is a model-definition error naming the directory (exit 4)."""
    import shutil

    src = tmp_path / "broken-remote"  # a name of its own: transformers caches remote modules
    shutil.copytree(remote_code_dir[0], src)
    code_file = src / "modeling_tiny.py"
    code_file.write_text(code_file.read_text().replace("        self.post_init()\n", ""))
    out = tmp_path / "tiny.pt2"
    argv = [str(src), "--to", "pt2", "-o", str(out), "--input", "x:2x8:float32"]
    code, body, _ = run_cli([*argv, "--trust-remote-code"], capsys)
    assert code == 4 and "transformers cannot load" in body["error"]["message"], body
    assert body["error"]["path"] == str(src) and not out.exists()


@pytest.mark.parametrize(
    ("config_name", "entry", "named"),
    [
        ("tokenizer_config.json", {"auto_map": {"AutoTokenizer": ["tok_x.XTok", None]}}, "XTok"),
        ("preprocessor_config.json", {"auto_map": {"AutoProcessor": "proc_x.XProc"}}, "XProc"),
        ("config.json", {"custom_pipelines": {"x": {"impl": "pipeline_x.XPipe"}}}, "XPipe"),
    ],
)
def test_tokenizer_processor_and_pipeline_code_need_trust_remote_code(
    samples, config_name: str, entry: dict, named: str, tmp_path: Path, capsys
) -> None:
    """A folder's code named by its tokenizer's, processor's or pipeline's config is the same
    grant: --trust alone is exit 11 naming the class and --trust-remote-code."""
    import json
    import shutil

    src = tmp_path / "bert"
    shutil.copytree(samples["hf_bert"], src)
    config = src / config_name
    body = json.loads(config.read_text()) if config.is_file() else {}
    config.write_text(json.dumps({**body, **entry}))
    out = tmp_path / "out"
    for grant in ([], ["--trust"]):
        code, got, _ = run_cli([str(src), "--to", "safetensors", "-o", str(out), *grant], capsys)
        assert code == 11 and named in got["error"]["message"], got
        assert "--trust-remote-code" in got["error"]["hint"] and not out.exists()
    argv = [str(src), "--to", "safetensors", "-o", str(out), "--trust-remote-code"]
    code, got, _ = run_cli(argv, capsys)
    assert code == 0, got
