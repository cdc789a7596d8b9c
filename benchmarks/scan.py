"""Scanner speed and detection against picklescan, modelscan and modelaudit, in one run.

1. Time to scan a generated ~1 GB torch checkpoint: `ptconvert scan` vs `picklescan --path`.
2. Time to scan the whole test corpus (malicious techniques + benign checkpoints) in one call
   per tool, and each tool's detections (malicious files flagged) and false alarms (benign
   files flagged), counted from one call per file (exit status non-zero = flagged).

picklescan, modelscan and modelaudit are installed only in the benchmark's own virtual environment
(--tools-venv, created on first use); they are not dependencies of ptconvert.
Run: `.venv/bin/python benchmarks/scan.py [--tools-venv /tmp/ptconvert-scan-tools]`.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from installed import as_installed

from fixtures.build import build_all
from fixtures.scan_corpus import benign_corpus, malicious_corpus

PTCONVERT = str(Path(sys.executable).parent / "ptconvert")


def tools(venv: Path) -> dict[str, list[str]]:
    if not (venv / "bin" / "modelaudit").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", "picklescan", "modelscan", "modelaudit"],
            check=True,
        )
    return {
        "ptconvert": [PTCONVERT, "scan", "--json"],
        "ptconvert (table)": [PTCONVERT, "scan"],
        "picklescan": [str(venv / "bin" / "picklescan"), "--path"],
        "modelscan": [str(venv / "bin" / "modelscan"), "-p"],
        "modelaudit": [str(venv / "bin" / "modelaudit"), "scan"],
    }


def timed(cmd: list[str], repeats: int = 3) -> float:
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def flagged(cmd: list[str], path: Path) -> bool:
    proc = subprocess.run([*cmd, str(path)], capture_output=True)
    return proc.returncode != 0


def main() -> None:
    as_installed()
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--tools-venv", type=Path, default=Path(tempfile.gettempdir()) / "ptconvert-scan-tools"
    )
    args = ap.parse_args()
    cmds = tools(args.tools_venv)
    work = Path(tempfile.mkdtemp(prefix="ptconvert-scanbench-"))
    try:
        big = work / "big.pt"
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import torch, sys; torch.save("
                "{f'w{i}': torch.zeros(2**24) for i in range(16)}, sys.argv[1])",
                str(big),
            ],
            check=True,
        )
        corpus = work / "corpus"
        fixtures = build_all(work / "fixtures", onnx=False)
        malicious = malicious_corpus(corpus / "malicious", work / "PAYLOAD_RAN")
        benign = benign_corpus(corpus / "benign", fixtures)
        # the benign set refers to fixtures outside the corpus folder: copy them in
        for name, (path, _) in list(benign.items()):
            if not path.is_relative_to(corpus):
                dest = corpus / "benign" / name
                shutil.copytree(path, dest) if path.is_dir() else shutil.copy(path, dest)
                benign[name] = (dest, benign[name][1])
        print(f"1 GB checkpoint ({big.stat().st_size / 2**30:.2f} GiB), median of 3:")
        big_times = {
            name: timed([*cmd, str(big)])
            for name, cmd in cmds.items()
            if name not in ("modelscan", "modelaudit")
        }
        for name, secs in big_times.items():
            print(f"  {name:17} {secs:6.2f} s")
        print(
            "  ratio ptconvert --json / picklescan: "
            f"{big_times['ptconvert'] / big_times['picklescan']:.2f}"
        )
        print(
            f"\ncorpus: {len(malicious)} malicious, {len(benign)} benign; "
            "one call per tool on the folder:"
        )
        corpus_times = {name: timed([*cmd, str(corpus)]) for name, cmd in cmds.items()}
        for name, secs in corpus_times.items():
            print(f"  {name:17} {secs:6.2f} s")
        fastest_other = min(v for k, v in corpus_times.items() if not k.startswith("ptconvert"))
        print(
            "  speedup vs the faster of the others: "
            f"{fastest_other / corpus_times['ptconvert']:.1f}x"
        )
        print("\ndetections (one call per file; flagged = non-zero exit):")
        for name, cmd in cmds.items():
            if name == "ptconvert (table)":
                continue
            hits = sum(flagged(cmd, p) for p in malicious.values())
            false = sum(flagged(cmd, p) for p, expected in benign.values() if expected == "clean")
            clean_total = sum(1 for _, e in benign.values() if e == "clean")
            print(
                f"  {name:17} malicious flagged {hits}/{len(malicious)}, "
                f"false alarms {false}/{clean_total}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
