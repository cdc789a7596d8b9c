"""The runtimes' own clients on what ptconvert writes (``make test-clients``, ``-m clients``).

Each test converts with ptconvert here (``.venv``), loads the artifact in a client started as a
subprocess (the clients' venv's python, ``.venv-optimum``: optimum's ORTModel classes with
transformers 4.57; llama.cpp's own runtime, llama-cpp-py-sync's prebuilt libraries, from
``.clients/llama.cpp``; the C++ loader ``.clients/loader`` compiled against that venv's libtorch;
ExecuTorch's LLM runner from ``.venv``'s executorch wheel) and compares what it computes with
the eager model in ``.venv`` (transformers 5.x): the reference is always computed here.
``tools/client_venv.py`` builds the venv and the loader; these fixtures only find them (a
missing or stale one fails, naming ``make test-clients``), so workers never build at once.

The tiny Hugging Face directories are tests/generation's (random init from configs, saved by
this venv's transformers as ``model.safetensors`` and ``config.json``): transformers 4.57 reads
the configs, and optimum's loaders read nothing else of them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from tools import client_venv

HERE = Path(__file__).resolve().parent


def missing(what: str) -> None:
    pytest.fail(f"{what} is missing or stale: run `make test-clients` (tools/client_venv.py)")


@pytest.fixture(scope="session")
def client_python() -> Path:
    """The clients' venv's python (optimum-onnx, transformers 4.57, the pinned CPU torch)."""
    if not client_venv.venv_ready(client_venv.VENV):
        missing(str(client_venv.VENV))
    return client_venv.VENV / "bin" / "python"


@pytest.fixture(scope="session")
def loader(client_python: Path) -> Path:
    """The C++ loader (tests/clients/loader.cpp) compiled against the venv's libtorch."""
    if not client_venv.loader_ready(client_python):
        missing(str(client_venv.LOADER))
    return client_venv.LOADER


@pytest.fixture(scope="session")
def llama_cpp(client_python: Path) -> Path:
    """llama.cpp's libraries (the venv's llama-cpp-py-sync wheel's) fitted to this machine's
    glibc by tools/llama_cpp_fit.py: the folder llama_cpp_client.py loads them from."""
    if not client_venv.llama_cpp_fit.fit_ready(client_python, client_venv.LLAMA_CPP):
        missing(str(client_venv.LLAMA_CPP))
    return client_venv.LLAMA_CPP


class ClientFailed(AssertionError):
    """A client exited non-zero; ``stderr`` is what it said."""

    def __init__(self, name: str, code: int, stderr: str) -> None:
        super().__init__(f"{name}: the client exited {code}\n{stderr[-3000:]}")
        self.stderr = stderr


def run_client(command: list[Any], inputs: Any, work: Path, name: str) -> Any:
    """Run a client on ``inputs`` (``torch.save``'d beside ``work``'s other files); returns
    what it wrote, read with ``torch.load(weights_only=True)``. A failing client raises
    :class:`ClientFailed` (an AssertionError: the test fails with its stderr's tail)."""
    given, got = work / f"{name}.in.pt", work / f"{name}.out.pt"
    torch.save(inputs, given)
    done = subprocess.run(
        [*map(str, command), str(given), str(got)], capture_output=True, text=True, timeout=600
    )
    (work / f"{name}.err.txt").write_text(done.stderr)
    if done.returncode != 0:
        raise ClientFailed(name, done.returncode, done.stderr)
    return torch.load(got, weights_only=True)


def ort_client(python: Path, cls: str, path: Path, inputs: dict[str, Any], work: Path) -> Any:
    """optimum's ``cls.from_pretrained(path)`` generating or classifying (ort_client.py)."""
    return run_client([python, HERE / "ort_client.py", cls, path], inputs, work, cls)


def ort_opened(cls: str, work: Path) -> dict[str, Any]:
    """What the last ``ort_client`` run of ``cls`` opened and ran (ort_client.py's
    OUTPUTS.json): each part's file, ``is_merged``, each decoder call's ``use_cache_branch``;
    ``stderr``: what it said."""
    import json

    said = (work / f"{cls}.err.txt").read_text()
    return {**json.loads((work / f"{cls}.out.pt.json").read_text()), "stderr": said}


def tiny_bert_classifier(out: Path) -> Path:
    """A tiny BertForSequenceClassification (two token types, three labels; initializer_range
    0.3 spreads the logits) saved under ``out``."""
    import transformers as t

    config = t.BertConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=37,
        num_labels=3,
        initializer_range=0.3,
    )
    torch.manual_seed(0)
    directory = out / "hf-bert-cls"
    t.BertForSequenceClassification(config).eval().save_pretrained(directory)
    return directory


def eager_classifier(directory: Path) -> Any:
    import transformers

    return transformers.AutoModelForSequenceClassification.from_pretrained(directory).eval()


def tiny_vit_classifier(out: Path) -> Path:
    """A tiny ViTForImageClassification (32×32 images in 8×8 patches, three labels) saved
    under ``out`` with a ViTImageProcessor's preprocessor_config.json beside it."""
    import transformers as t

    config = t.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=37,
        num_labels=3,
    )
    torch.manual_seed(0)
    directory = out / "hf-vit-cls"
    t.ViTForImageClassification(config).eval().save_pretrained(directory)
    t.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(directory)
    return directory


def eager_image_classifier(directory: Path) -> Any:
    import transformers

    return transformers.AutoModelForImageClassification.from_pretrained(directory).eval()
