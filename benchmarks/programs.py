"""Program conversion at the size users convert: ptconvert against the raw torch API.

Builds a GPT-2-shaped decoder with random weights (default n_embd 1024, 12 layers: ~204 M
parameters, a 0.8 GB safetensors directory) and measures, interleaved in the same run, wall time
and peak RSS of:

- raw: ``from_pretrained`` + ``torch.export`` with a dynamic batch and sequence (the dims
  ptconvert's ``--dynamic-batch`` makes dynamic for a text model) + ``torch.export.save``;
- ``ptconvert DIR --to pt2 --dynamic-batch`` (the default verification);
- the same with ``--no-verify``.

The verification's own time (the run minus its route's steps) comes from one ``--json`` run.
Run: ``.venv/bin/python benchmarks/programs.py [--n-embd 1024] [--n-layer 12] [--rounds 2]``;
``--factory`` measures a ``--model`` factory's checkpoint (a 201 M Linear stack) instead.
Memory is the peak owned by all the command's processes together (anonymous pages, sampled
every 20 ms: the fresh interpreter that runs the written file counts; pages of a file mapped from
the page cache do not, as the kernel can drop them), beside the largest process's peak RSS.
Targets: the default verification ≤ 1.3× raw wall and ≤ 1.2× raw memory; ``--no-verify`` ≤ 1.1×
both.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from installed import as_installed
from rows import emit

BIN = Path(sys.executable).parent

RAW = """
import sys, torch, transformers
src, out = sys.argv[1], sys.argv[2]
model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
model.config.use_cache = False
ids = torch.randint(0, 1000, (2, 16))
mask = torch.ones_like(ids)
# what ptconvert's --dynamic-batch writes for a text model: batch and sequence dynamic
limit = model.config.max_position_embeddings
batch, seq = torch.export.Dim("batch_size"), torch.export.Dim("sequence_length", max=limit)
shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
with torch.no_grad():
    ep = torch.export.export(
        model, (), {"input_ids": ids, "attention_mask": mask}, dynamic_shapes=shapes, strict=False
    )
torch.export.save(ep, out)
"""


STACK = """
import torch
from torch import nn


class Stack(nn.Module):
    def __init__(self, width: int = 4096, depth: int = 12) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def make() -> nn.Module:
    return Stack()
"""

RAW_FACTORY = """
import sys, torch
from safetensors.torch import load_file
sys.path.insert(0, sys.argv[3])
import stack
src, out = sys.argv[1], sys.argv[2]
model = stack.make().eval()
model.load_state_dict(load_file(src))
x = torch.randn(2, 4096)
ep = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
torch.export.save(ep, out)
"""


def _tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _memory(pid: int) -> tuple[int, int]:
    """Bytes the process owns (anonymous and shared-memory pages: what the kernel cannot drop,
    unlike pages of files it maps, which stay in the page cache) and its resident bytes."""
    owned = resident = 0
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(("RssAnon:", "RssShmem:")):
                    owned += int(line.split()[1]) * 1024
                elif line.startswith("VmRSS:"):
                    resident = int(line.split()[1]) * 1024
    except OSError:
        pass
    return owned, resident


def measure(cmd: list[str], outputs: list[Path]) -> tuple[float, float, float, float]:
    """(seconds, peak RSS of the largest process, peak memory owned by all processes of the
    command together, peak of their RSS summed — file pages mapped by two processes count
    twice), in MiB, sampled every 20 ms; its outputs removed first."""
    for out in outputs:
        shutil.rmtree(out) if out.is_dir() else out.unlink(missing_ok=True)
    os.sync()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    peak = [0, 0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            both = [_memory(p) for p in _tree(proc.pid)]
            peak[0] = max(peak[0], sum(o for o, _ in both))
            peak[1] = max(peak[1], sum(r for _, r in both))
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    done.set()
    sampler.join()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return elapsed, usage.ru_maxrss / 1024, peak[0] / 2**20, peak[1] / 2**20


def build_factory(directory: Path) -> int:
    """A --model factory (a stack of 12 Linear(4096, 4096): 201 M parameters) and its
    weights in one safetensors file."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "stack.py").write_text(STACK)
    code = f"""
import sys, torch
from safetensors.torch import save_file
sys.path.insert(0, {str(directory)!r})
import stack
torch.manual_seed(0)
model = stack.make()
save_file(model.state_dict(), {str(directory / "stack.safetensors")!r})
print(sum(p.numel() for p in model.parameters()))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


def build(directory: Path, n_embd: int, n_layer: int) -> int:
    code = f"""
import torch, transformers
torch.manual_seed(0)
config = transformers.GPT2Config(n_embd={n_embd}, n_layer={n_layer}, n_head=16, n_positions=1024)
model = transformers.GPT2LMHeadModel(config).eval()
model.save_pretrained({str(directory)!r})
print(sum(p.numel() for p in model.parameters()))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


def ptconvert(src: Path, out: Path) -> list[str]:
    # --no-cache: every round converts (the cache would serve the second one in no time)
    cmd = [str(BIN / "ptconvert"), str(src), "--to", "pt2", "--dynamic-batch", "-o", str(out)]
    if src.suffix == ".safetensors":  # the factory's checkpoint
        cmd += ["--model", f"{src.parent / 'stack.py'}:make", "--input", "x:2x4096:float32"]
    return [*cmd, "--no-cache"]


def split(src: Path, out: Path) -> str:
    """The route's steps against the verification, from one --json run."""
    out.unlink(missing_ok=True)
    cmd = [*ptconvert(src, out), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    steps = {s["step"]: s["seconds"] for s in report["steps"]}
    spent = sum(steps.values())
    return (
        f"steps {spent:.1f} s ({', '.join(f'{k} {v:.1f}' for k, v in steps.items())}); "
        f"verification and the rest {report['seconds'] - spent:.1f} s of {report['seconds']:.1f} s"
    )


def main() -> None:
    as_installed()
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-embd", type=int, default=1024)
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument(
        "--factory",
        action="store_true",
        help="a --model factory's checkpoint (a 201 M Linear stack) instead of a HF directory",
    )
    args = ap.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="ptconvert-programs-"))
    raw = work / "raw.py"
    if args.factory:
        params = build_factory(work / "factory")
        src = work / "factory" / "stack.safetensors"
        raw.write_text(RAW_FACTORY)
        title = "Linear stack (--model factory)"
    else:
        src = work / "gpt2"
        params = build(src, args.n_embd, args.n_layer)
        raw.write_text(RAW)
        title = "GPT-2 decoder"
    out = work / "out.pt2"
    ptc = ptconvert(src, out)
    commands = {
        "raw API": [sys.executable, str(raw), str(src), str(out), str(src.parent)],
        "ptconvert": ptc,
        "ptconvert --no-verify": [*ptc, "--no-verify"],
    }
    walls: dict[str, list[float]] = {k: [] for k in commands}
    peaks: dict[str, float] = dict.fromkeys(commands, 0.0)
    owned: dict[str, float] = dict.fromkeys(commands, 0.0)
    for _ in range(args.rounds):  # interleaved: load and cache state hit all alike
        for name, cmd in commands.items():
            seconds, rss, mem, _ = measure(cmd, [out])
            walls[name].append(seconds)
            peaks[name] = max(peaks[name], rss)
            owned[name] = max(owned[name], mem)
    print(f"{title}, {params / 1e6:.0f} M parameters, {args.rounds} interleaved rounds")
    print("memory: the peak owned by all the command's processes together (anonymous pages;")
    print("a file's pages mapped from the page cache are not counted); RSS: the largest process")
    print(
        f"{'':24} {'wall s':>7} {'memory MiB':>11} {'RSS MiB':>8} {'wall ×raw':>10} {'mem ×raw':>9}"
    )
    base_wall, base_mem = statistics.median(walls["raw API"]), owned["raw API"]
    for name in commands:
        wall = statistics.median(walls[name])
        print(
            f"{name:24} {wall:7.1f} {owned[name]:11.0f} {peaks[name]:8.0f} "
            f"{wall / base_wall:10.2f} {owned[name] / base_mem:9.2f}"
        )
    print("targets: ptconvert ≤ 1.3× wall and ≤ 1.2× memory; --no-verify ≤ 1.1× both")
    what = f"{params / 1e6:.0f} M {title} → verified pt2"
    wall = statistics.median(walls["ptconvert"])
    emit(f"{what}, wall", "raw torch.export + save", base_wall, wall / base_wall, 1.3, "×")
    mem = owned["ptconvert"] / base_mem
    emit(f"{what}, memory", "raw torch.export + save", None, mem, 1.2, "×")
    print(split(src, out))


if __name__ == "__main__":
    main()
