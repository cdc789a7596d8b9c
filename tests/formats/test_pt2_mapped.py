"""The conversion's fresh interpreter loads a .pt2 with its weights mapped from the file
(formats/pt2.py: mapped_weights): no second copy of the weights beside the model just exported,
the same numbers as torch.export.load, and the file never written."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

from ptconvert.formats import FORMATS_BY_NAME


class Counter(nn.Module):
    """64 MiB of weights and a buffer each call changes (the map is copy-on-write)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4096, 4096)
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return self.lin(x) + self.calls


def test_the_fresh_load_maps_the_weights(tmp_path: Path) -> None:
    path = tmp_path / "c.pt2"
    torch.manual_seed(0)
    model = Counter()
    x = torch.randn(2, 4096)
    torch.export.save(torch.export.export(Counter().eval(), (x,)), path)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    code = (
        "import sys, torch\n"
        "def anon():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('RssAnon:'):\n"
        "            return int(line.split()[1]) * 1024\n"
        "p = sys.argv[1]\n"
        "import torch.export.pt2_archive._package, ptconvert.formats.pt2\n"
        "start = anon()\n"
        f"{FORMATS_BY_NAME['pt2'].fresh_load_line}\n"
        "grew = anon() - start\n"
        "x = torch.load(sys.argv[2])\n"
        "with torch.no_grad():\n"
        "    outs = [prog(x), prog(x)]\n"
        "plain = torch.export.load(p).module()\n"
        "with torch.no_grad():\n"
        "    same = all(torch.equal(o, plain(x)) for o in outs)\n"
        "print(grew, same)\n"
    )
    torch.save(x, tmp_path / "x.pt")
    done = subprocess.run(
        [sys.executable, "-c", code, str(path), str(tmp_path / "x.pt")],
        capture_output=True,
        text=True,
    )
    grew, same = done.stdout.split()
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert int(grew) < weights / 4, (grew, weights)  # torch.export.load alone copies them all
    assert same == "True", done.stderr  # each call on its own counter, as the plain load's
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
