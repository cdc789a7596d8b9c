"""Startup cost: `ptconvert --help` and `ptconvert info` on safetensors vs bare Python.

Measured side by side in one run (median of N runs each). Target: `--help` within 0.3 s of
`python -c pass`. Run: `.venv/bin/python benchmarks/startup.py`.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from installed import as_installed

REPEATS = 7


def timed(cmd: list[str]) -> float:
    samples = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def main() -> None:
    as_installed()
    with tempfile.TemporaryDirectory() as tmp:
        sample = Path(tmp) / "sample.safetensors"
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import torch, safetensors.torch as s, sys;"
                "s.save_file({'w': torch.zeros(256, 256)}, sys.argv[1])",
                str(sample),
            ],
            check=True,
        )
        bare = timed([sys.executable, "-c", "pass"])
        helped = timed([sys.executable, "-m", "ptconvert", "--help"])
        info = timed([sys.executable, "-m", "ptconvert", "info", str(sample), "--json"])
    print(f"python -c pass            {bare * 1000:7.1f} ms")
    print(f"ptconvert --help          {helped * 1000:7.1f} ms  (+{(helped - bare) * 1000:.1f} ms)")
    print(f"ptconvert info (sft)      {info * 1000:7.1f} ms  (+{(info - bare) * 1000:.1f} ms)")
    print(f"ratio --help / bare       {helped / bare:7.2f}x  target: within +300 ms")


if __name__ == "__main__":
    main()
