"""What the check costs beside the steps it checks, on the tiny models of the test corpus.

Converts every tiny Hugging Face directory that ``fixtures.build`` writes (BERT, GPT-2, Llama,
ViT, T5, Whisper) and the bundled MLP ``--to pt2`` and ``--to onnx`` with ``--dynamic-batch``
(no cache), once with ``--no-verify`` and once verified, and prints from the ``--json`` reports
the route's steps' seconds (unverified), what verifying adds to the run (the verified run's
seconds less the unverified one's: eager runs, the program at each size, probes of every
dynamic dim, the fresh process or runtime, and a step refused and taken again) and their
ratio. Target: the check never costs more than the steps (ratio ≤ 1.0).

Run: ``.venv/bin/python benchmarks/verify_cost.py [--to pt2 onnx] [--models whisper t5]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from installed import as_installed

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MODELS = ["mlp", "bert", "gpt2-bin", "llama", "vit", "t5", "whisper"]


def build(work: Path) -> dict[str, Path]:
    code = f"import pathlib, fixtures.build as b; b.build_all(pathlib.Path({str(work)!r}))"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True)
    found = {name: work / f"hf-{name}" for name in MODELS if (work / f"hf-{name}").is_dir()}
    found["mlp"] = work / "mlp.pt"
    return found


def convert(src: Path, to: str, out: Path, *extra: str) -> dict:
    cmd = [str(BIN / "ptconvert"), str(src), "--to", to, "--dynamic-batch", "-o", str(out)]
    cmd += ["--force", "--no-cache", "--json", *extra]
    if src.suffix == ".pt":
        cmd += ["--model", "fixtures.models:MLP", "--input", "x:2x8:float32"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    report = json.loads(done.stdout) if done.stdout.strip() else {}
    if done.returncode != 0:
        return {"error": (report.get("error") or {}).get("message", done.stderr[-200:])}
    return report


def main() -> None:
    as_installed()
    ap = argparse.ArgumentParser()
    ap.add_argument("--to", nargs="+", default=["pt2", "onnx"])
    ap.add_argument("--models", nargs="+", default=MODELS)
    args = ap.parse_args()
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="ptconvert-verify-cost-") as tmp:
        work = Path(tmp)
        sources = build(work)
        print(f"{'model':10} {'to':5} {'steps s':>8} {'check s':>8} {'check/steps':>12}")
        for name in args.models:
            for to in args.to:
                bare = convert(sources[name], to, work / f"{name}.{to}", "--no-verify")
                report = convert(sources[name], to, work / f"{name}.{to}")
                if "error" in report or "error" in bare:
                    why = report.get("error") or bare.get("error")
                    print(f"{name:10} {to:5} failed: {why[:60]}")
                    continue
                steps = sum(s["seconds"] for s in bare["steps"])
                check = report["seconds"] - bare["seconds"]
                ratio = check / steps if steps else float("inf")
                worst = max(worst, ratio)
                print(f"{name:10} {to:5} {steps:8.1f} {check:8.1f} {ratio:12.2f}")
    print(f"worst check/steps {worst:.2f} (target ≤ 1.0)")


if __name__ == "__main__":
    main()
