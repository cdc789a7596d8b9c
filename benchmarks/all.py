"""Every headline speed target in one run (``make bench``), each against its reference.

Runs, one after the other, each printing its own tables as it goes:

- ``onnx.py --cases bert,bert-ts,gpt2-past,gpt2-past-ts``: tiny BERT and tiny GPT-2 with past
  → verified ONNX, by either exporter (``-ts``: ``--onnx-exporter torchscript``),
  against ``optimum-cli export onnx`` (its venv, ``.venv-optimum``, is built the first time);
- ``weights.py``: a 1 GiB pickle ↔ safetensors, verified, synced, against ``cp``;
- ``programs.py``: a 204 M GPT-2 → verified pt2 against the raw ``torch.export`` + save;
- ``make demo`` after setup, then ``--to all`` on the demo's MLP, timed alone;

then prints the rows together (``rows.py`` carries them): the date, the machine, the load
average before and after (a busy machine's ratios are not comparable), each measure, its
reference, ratio or seconds, goal and verdict. ``--quick`` runs fewer rounds (1 instead of 3,
and the programs once) for a look, not for the record.

Run: ``.venv/bin/python benchmarks/all.py [--quick]`` — about 15 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from installed import as_installed
from rows import ENV, emit

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BIN = Path(sys.executable).parent


def machine() -> str:
    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return f"{os.cpu_count()} cores ({cpu}), {pages / 2**30:.0f} GiB, {platform.system()}"


def timed(cmd: list[str], **kwargs: object) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, **kwargs)  # type: ignore[call-overload]
    return time.perf_counter() - start


def demo_rows(work: Path) -> None:
    """``make demo`` into a fresh folder with an empty cache, as on a new machine after
    ``make setup`` (run first, untimed), then the demo's ``--to all`` alone."""
    demo = work / "demo"
    subprocess.run(["make", "-s", "setup"], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    env = {**os.environ, "PTCONVERT_CACHE": str(work / "cache")}
    make = ["make", "-s", "demo", f"DEMO_DIR={demo}"]
    seconds = timed(make, cwd=REPO, stdout=subprocess.DEVNULL, env=env)
    print(f"make demo: {seconds:.1f} s")
    emit("make demo after setup", "", None, seconds, 300, "s")
    every = [str(BIN / "ptconvert"), str(demo / "mlp.pt"), "--to", "all"]
    every += ["-o", str(work / "every"), "--model", "fixtures.models:MLP"]
    every += ["--input", "x:2x8:float32", "--dynamic-batch", "--no-cache"]
    seconds = timed(every, cwd=REPO, stdout=subprocess.DEVNULL)
    print(f"--to all on the demo MLP: {seconds:.1f} s")
    emit("--to all on the demo MLP", "", None, seconds, 60, "s")


def table(rows: list[dict], before: float, after: float) -> str:
    lines = [
        f"{datetime.date.today()}, {machine()}; load average {before:.2f} before, "
        f"{after:.2f} after",
        f"{'measure':58} {'reference':24} {'ref s':>6} {'ours':>7} {'goal':>7}  verdict",
    ]
    for r in rows:
        ref_s = f"{r['ref_value']:.2f}" if r["ref_value"] is not None else ""
        unit = r["unit"]
        ours = f"{r['value']:.2f}{unit}"
        goal = f"≤ {r['goal']:g}{unit}"
        verdict = "met" if r["value"] <= r["goal"] else "NOT met"
        lines.append(
            f"{r['measure'][:58]:58} {r['reference'][:24]:24} {ref_s:>6} {ours:>7} {goal:>7}  "
            f"{verdict}"
        )
    return "\n".join(lines)


def main() -> None:
    as_installed()
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds: a look, not a record")
    ap.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp one)")
    args = ap.parse_args()
    rounds = "1" if args.quick else "3"
    with tempfile.TemporaryDirectory(prefix="ptconvert-bench-all-", dir=args.dir) as tmp:
        work = Path(tmp)
        os.environ[ENV] = str(work / "rows.jsonl")
        before = os.getloadavg()[0]
        py = sys.executable
        runs = [
            [
                py,
                str(HERE / "onnx.py"),
                "--cases",
                "bert,bert-ts,gpt2-past,gpt2-past-ts",
                "--repeats",
                rounds,
            ],
            [py, str(HERE / "weights.py"), "--repeats", rounds],
            [py, str(HERE / "programs.py"), "--rounds", "1" if args.quick else "2"],
        ]
        (work / "programs").mkdir()
        runs[2] += ["--dir", str(work / "programs")]  # its 0.8 GB model goes with the folder
        for cmd in runs:
            print(f"\n== {' '.join(Path(c).name if c.endswith('.py') else c for c in cmd[1:])}")
            sys.stdout.flush()
            subprocess.run(cmd, check=True, cwd=work)
        print("\n== make demo, --to all")
        demo_rows(work)
        after = os.getloadavg()[0]
        rows = [json.loads(line) for line in (work / "rows.jsonl").read_text().splitlines()]
    print("\n" + table(rows, before, after))


if __name__ == "__main__":
    main()
