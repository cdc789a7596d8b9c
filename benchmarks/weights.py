"""Weights conversion speed and memory against `cp` and the naive torch reference.

Generates a checkpoint of --size-gb (default 1; fp32/bf16/fp16 tensors, a tied pair, a view of a
larger storage) and measures, side by side in one run, wall time and peak RSS of each command:

- cp (the floor), and reading the file once (cat > /dev/null)
- ptconvert pickle → safetensors (with and without its bitwise verification)
- the naive reference: torch.load + safetensors.torch.save_file
- ptconvert safetensors → pickle, and pickle → sharded safetensors (--max-shard-size 500MB)
- a 256 KiB checkpoint → safetensors, verified (the start-up and check cost of a small file)

and prints each target of the weights path against its measurement: verified ≤ 2.0× `cp`,
`--no-verify` ≤ 1.2× `cp` (both directions), the small checkpoint verified in ≤ 0.5 s.

Every command is timed until its output is on disk (`cmd && sync`, as issue 45 measures it: the
next step reads it); `--unsynced` times it until it exits, the output in the page cache.

Run: `.venv/bin/python benchmarks/weights.py [--size-gb 2] [--dir DIR] [--repeats 5]`. Warm page
cache: every command runs once untimed first, then --repeats rounds interleave all commands
(median wall time, highest peak RSS); outputs are removed and the disk synced before each run, so
that freeing or flushing the previous output is not timed. The verification reads the source
again with an independent reader (stdlib pickle records for pickles, safe_open and the header's
offsets for safetensors; neither imports torch): its share of each verifying conversion is
printed after the table.
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
import time
from pathlib import Path

from installed import as_installed
from rows import emit

BIN = Path(sys.executable).parent
REPEATS = 5  # median wall time of these runs; the highest peak RSS


def make_checkpoint(path: Path, size_gb: float) -> None:
    code = f"""
import torch
n = int({size_gb} * 2**30)
sd = {{}}
gen = torch.Generator().manual_seed(0)
per = 64 * 2**20  # 64 MiB tensors
i = 0
left = n
while left > 0:
    dt = (torch.float32, torch.bfloat16, torch.float16)[i % 3]
    numel = min(per, left) // torch.empty(0, dtype=dt).element_size()
    sd[f"layer{{i}}.weight"] = torch.empty(numel // 1024, 1024, dtype=dt).uniform_(generator=gen)
    left -= numel * torch.empty(0, dtype=dt).element_size()
    i += 1
emb = torch.randn(1000, 256)
sd["embed.weight"] = emb
sd["lm_head.weight"] = emb  # tied
sd["view"] = torch.arange(4096, dtype=torch.float32)[1024:3072].view(32, 64)
torch.save(sd, {str(path)!r})
"""
    subprocess.run([sys.executable, "-c", code], check=True)


def measure(cmd: list[str], outputs: list[Path], synced: bool = True) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one command, its outputs removed and the disk synced first;
    ``synced``: the time until its output is on disk (``cmd && sync``), as the next step that
    reads it (or a crash) needs it, not until it sits in the page cache."""
    for out in outputs:
        shutil.rmtree(out) if out.is_dir() else out.unlink(missing_ok=True)
    os.sync()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if synced:
        os.sync()
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return elapsed, usage.ru_maxrss / 1024


def verification_split(cmd: list[str], outputs: list[Path]) -> str:
    """The verification's seconds and its independent reader's share, from one --json run."""
    for out in outputs:
        shutil.rmtree(out) if out.is_dir() else out.unlink(missing_ok=True)
    done = subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=True)
    check = json.loads(done.stdout)["weights"]["verification"]
    return (
        f"verification {check['seconds']:.2f} s, of which the independent reader "
        f"({check['reader']}) {check['reader_seconds']:.2f} s"
    )


# (row, limit, unit): × cp, or seconds
TARGETS = [
    ("ptconvert pt→safetensors", 2.0, "× cp"),
    ("pt→safetensors --no-verify", 1.2, "× cp"),
    ("ptconvert safetensors→pt", 2.0, "× cp"),
    ("safetensors→pt --no-verify", 1.2, "× cp"),
    ("256 KiB pt→safetensors", 0.5, "s"),
]


def print_targets(results: dict[str, tuple[float, float]], size: str, synced: bool) -> None:
    cp_time = results["cp"][0]
    print("targets:")
    for name, limit, unit in TARGETS:
        value = results[name][0] / cp_time if unit == "× cp" else results[name][0]
        verdict = "met" if value <= limit else "NOT met"
        print(f"  {name:30} {value:6.2f} {unit:5} (≤ {limit} {unit}): {verdict}")
        if unit == "× cp":
            how = "synced" if synced else "page cache"
            emit(f"{size} {name} ({how})", "cp", cp_time, value, limit, "×")
        else:
            emit(name, "", None, value, limit, "s")


def main() -> None:
    as_installed()
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=REPEATS)
    ap.add_argument(
        "--unsynced",
        dest="synced",
        action="store_false",
        help="time each command until it exits, its output in the page cache (default: synced)",
    )
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ptconvert-bench-", dir=args.dir))
    try:
        ckpt = work / "model.pt"
        make_checkpoint(ckpt, args.size_gb)
        small = work / "small.pt"
        make_checkpoint(small, 256 / 2**20)
        sft, back, shards = work / "model.safetensors", work / "back.pt", work / "shards"
        ptc = str(BIN / "ptconvert")
        naive = (
            "import torch, sys; from safetensors.torch import save_file;"
            "sd = torch.load(sys.argv[1], weights_only=True);"
            "sd.pop('lm_head.weight');"
            "save_file({k: v.contiguous() for k, v in sd.items()}, sys.argv[2])"
        )
        pt_to_sft = [ptc, str(ckpt), "--to", "safetensors", "-o", str(sft)]
        naive_cmd = [sys.executable, "-c", naive, str(ckpt), str(work / "naive.sft")]
        shard_cmd = [ptc, str(ckpt), "--to", "safetensors", "--max-shard-size", "500MB"]
        cases = [  # (name, command, outputs removed before each run)
            ("cp", ["cp", str(ckpt), str(work / "copy.pt")], [work / "copy.pt"]),
            ("read once (cat)", ["sh", "-c", f"cat {ckpt} > /dev/null"], []),
            ("ptconvert pt→safetensors", pt_to_sft, [sft]),
            ("pt→safetensors --no-verify", [*pt_to_sft, "--no-verify"], [sft]),
            ("naive torch.load+save_file", naive_cmd, [work / "naive.sft"]),
            ("ptconvert safetensors→pt", [ptc, str(sft), "--to", "pt", "-o", str(back)], [back]),
            (
                "safetensors→pt --no-verify",
                [ptc, str(sft), "--to", "pt", "-o", str(back), "--no-verify"],
                [back],
            ),
            ("ptconvert pt→sharded 500MB", [*shard_cmd, "-o", str(shards)], [shards]),
            (
                "256 KiB pt→safetensors",
                [ptc, str(small), "--to", "safetensors", "-o", str(work / "small.sft")],
                [work / "small.sft"],
            ),
        ]
        for _, cmd, outputs in cases:  # warm the page cache and the imports
            measure(cmd, outputs, args.synced)
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in cases}
        for _ in range(args.repeats):  # interleaved, so that disk and cache state hit all alike
            for name, cmd, outputs in cases:
                runs[name].append(measure(cmd, outputs, args.synced))
        results = {
            name: (statistics.median(r[0] for r in rs), max(r[1] for r in rs))
            for name, rs in runs.items()
        }
        size = ckpt.stat().st_size
        cp_time = results["cp"][0]
        print(f"checkpoint: {size / 2**30:.2f} GiB, {os.cpu_count()} cores")
        print(f"{'command':32} {'seconds':>8} {'× cp':>7} {'peak RSS':>10}")
        for name, (secs, rss) in results.items():
            print(f"{name:32} {secs:8.2f} {secs / cp_time:7.2f} {rss:8.0f} MiB")
        for name, cmd, outputs in cases:
            if name.startswith("ptconvert ") and "sharded" not in name:
                print(f"{name}: {verification_split(cmd, outputs)}")
        print_targets(results, f"{size / 2**30:.0f} GiB", args.synced)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
