"""What defines the model is wrong: config.json unreadable or unknown, weights of other shapes
(a Hugging Face directory, a --model factory). A named error (exit 4, ``model_definition``)
naming the file, shapes listed per tensor; from the API a PtconvertError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import ptconvert
from ptconvert.errors import ModelDefinitionError
from tests.conftest import run_cli


def _hf(samples: dict[str, Path], tmp_path: Path) -> Path:
    directory = tmp_path / "bert"
    shutil.copytree(samples["hf_bert"], directory)
    return directory


def _refused(args: list[str], capsys: pytest.CaptureFixture[str], path: Path) -> str:
    code, report, _ = run_cli(args, capsys)
    assert code == 4, report
    error = report["error"]
    assert (error["kind"], error["path"]) == ("model_definition", str(path)), error
    return str(error["message"])


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"model_type": "bert",', "is not valid JSON"),
        ("[1, 2]", "is not a JSON object (it holds a list)"),
    ],
)
def test_config_json_that_is_not_an_object(
    samples: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    text: str,
    said: str,
) -> None:
    directory = _hf(samples, tmp_path)
    (directory / "config.json").write_text(text)
    config = directory / "config.json"
    assert said in _refused(["info", str(directory)], capsys, config)
    out = tmp_path / "m.pt2"
    assert said in _refused([str(directory), "--to", "pt2", "-o", str(out)], capsys, config)


def test_a_model_type_transformers_does_not_know(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = _hf(samples, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    config["model_type"] = "no-such-model"
    config.pop("architectures", None)
    (directory / "config.json").write_text(json.dumps(config))
    args = [str(directory), "--to", "pt2", "-o", str(tmp_path / "m.pt2")]
    said = _refused(args, capsys, directory / "config.json")
    assert "cannot read this config" in said and "no-such-model" in said


def test_hugging_face_weights_of_another_shape_are_listed(
    samples: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = _hf(samples, tmp_path)
    weights = load_file(directory / "model.safetensors")
    name = "embeddings.word_embeddings.weight"
    weights[name] = torch.zeros(50, weights[name].shape[1])
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    args = [str(directory), "--to", "pt2", "-o", str(tmp_path / "m.pt2")]
    said = _refused(args, capsys, directory)
    assert f"{name}: [50, 32] in the weights, [99, 32] in the model" in said


def test_factory_weights_of_another_shape_are_listed_and_the_api_raises_a_named_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "net.py").write_text(
        "import torch\n\ndef make():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), "
        "torch.nn.Linear(4, 2))\n"
    )
    src = tmp_path / "w.pt"
    torch.save(
        {
            "0.weight": torch.zeros(4, 9),
            "0.bias": torch.zeros(4),
            "2.weight": torch.zeros(2, 4),
            "2.bias": torch.zeros(3),
        },
        src,
    )
    spec = ["--model", f"{tmp_path / 'net.py'}:make", "--input", "x:2x8:float32"]
    said = _refused([str(src), "--to", "pt2", "-o", str(tmp_path / "m.pt2"), *spec], capsys, src)
    assert "0.weight: [4, 9] in the weights, [4, 8] in the model" in said
    assert "2.bias: [3] in the weights, [2] in the model" in said
    with pytest.raises(ModelDefinitionError) as caught:
        ptconvert.convert(
            src,
            "pt2",
            tmp_path / "m.pt2",
            model=f"{tmp_path / 'net.py'}:make",
            inputs=["x:2x8:float32"],
        )
    assert isinstance(caught.value, ptconvert.PtconvertError) and caught.value.exit_code == 4
