"""The ``>>>`` examples of the public API's docstrings run, in the order a reader meets the
calls, in a folder that holds what they name: ``model.bin`` (the weights of
``mypkg.nets:make``), ``pytorch_model.bin``, a ``zoo/`` of two checkpoints and a truncated one.
Examples marked ``+SKIP`` take minutes (every format, AOTInductor, torch.compile) and are run
by their own tests."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest
import torch

import ptconvert
from ptconvert import api

NETS = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def make() -> nn.Module:
    torch.manual_seed(0)
    return Net()
"""

# the order a reader meets them: an output an example writes is read by the next ones
ORDER = [
    "options",
    "detect",
    "scan",
    "plan",
    "convert",
    "describe",
    "verify",
    "cache_info",
    "cache_clear",
    "convert_many",
    "generate",
    "convert_every",
    "optimize",
    "bench",
]


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "nets.py").write_text(NETS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    nets = importlib.import_module("mypkg.nets")
    state = nets.make().state_dict()
    for name in ("model.bin", "pytorch_model.bin", "zoo/a.pt", "zoo/b.pt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        torch.save(state, tmp_path / name)
    whole = (tmp_path / "model.bin").read_bytes()
    (tmp_path / "zoo" / "broken.pt").write_bytes(whole[: len(whole) // 2])
    return tmp_path


def test_the_api_docstring_examples_run(folder: Path) -> None:
    finder = doctest.DocTestFinder()
    found = {t.name.rsplit(".", 1)[-1]: t for t in finder.find(api, globs={"ptconvert": ptconvert})}
    examples = {name: t for name, t in found.items() if t.examples}
    assert set(examples) == set(ORDER), sorted(examples)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for name in ORDER:
        test = examples[name]
        test.globs.update(vars(api), ptconvert=ptconvert)
        result = runner.run(test, clear_globs=False)
        assert result.failed == 0, f"the example of ptconvert.{name} failed (output above)"
