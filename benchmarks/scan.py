"""Scanner speed and detection against picklescan, modelscan and modelaudit, in one run.

1. Time to scan a generated ~1 GB torch checkpoint: `ptconvert scan` vs `picklescan --path`.
2. Time to scan the whole test corpus (malicious techniques + benign checkpoints) in one call
   per tool, and each tool's detections (malicious files flagged) and false alarms (benign
   files flagged), counted from one call per file (exit status non-zero = flagged).
3. (`--folder`: this part only, picklescan only) a folder scan as CI runs it: a model folder
   as the Hub holds one (safetensors and a state dict, configs, tokenizer files, a README,
   training logs, a script), `ptconvert scan DIR` vs `picklescan --path DIR`, with where
   ptconvert's time goes (the interpreter, imports, the scan).

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


def tools(
    venv: Path, wanted: tuple[str, ...] = ("picklescan", "modelscan", "modelaudit")
) -> dict[str, list[str]]:
    if not all((venv / "bin" / w).exists() for w in wanted):
        if not (venv / "bin" / "pip").exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *wanted], check=True)
    return {
        "ptconvert": [PTCONVERT, "scan", "--json"],
        "ptconvert (table)": [PTCONVERT, "scan"],
        "picklescan": [str(venv / "bin" / "picklescan"), "--path"],
        "modelscan": [str(venv / "bin" / "modelscan"), "-p"],
        "modelaudit": [str(venv / "bin" / "modelaudit"), "scan"],
    }


def model_folder(root: Path) -> Path:
    """A model folder as the Hub holds one: 2 model files among 30."""
    import json

    (root / "logs").mkdir(parents=True)
    script = (
        "import sys, torch\n"
        "from safetensors.torch import save_file\n"
        "sd = {f'layer{i}.weight': torch.randn(256, 256) for i in range(24)}\n"
        "torch.save(sd, sys.argv[1] + '/pytorch_model.bin')\n"
        "save_file(sd, sys.argv[1] + '/model.safetensors')\n"
    )
    subprocess.run([sys.executable, "-c", script, str(root)], check=True)
    (root / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 256}))
    for name in ("tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        (root / name).write_text(json.dumps({"pad_token": "[PAD]"}))
    vocab = {f"tok{i}": i for i in range(30000)}
    (root / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}}))
    (root / "vocab.txt").write_text("\n".join(vocab))
    (root / "README.md").write_text("# A model\n\nTrained with train.py.\n" * 20)
    (root / "train.py").write_text("import torch\n\nprint('training')\n")
    for i in range(20):
        (root / "logs" / f"run{i}.log").write_text("step 1 loss 0.5\n" * 2000)
    return root


def folder_timings(cmds: dict[str, list[str]], work: Path, repeats: int = 15) -> None:
    folder = model_folder(work / "model")
    n = sum(1 for p in folder.rglob("*") if p.is_file())
    print(f"model folder: {n} files, 2 model files; median of {repeats}:")
    py = [sys.executable, "-c"]
    parts = {
        "python -c pass": [*py, "pass"],
        "import ptconvert.cli": [*py, "import ptconvert.cli"],
        "… and rich (the table)": [*py, "import ptconvert.cli, ptconvert.render"],
    }
    runs = {name: [*cmd, str(folder)] for name, cmd in cmds.items()} | parts
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):  # round-robin: a busy machine's drift falls on every command alike
        for name, cmd in runs.items():
            t = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            samples[name].append(time.perf_counter() - t)
    times = {name: statistics.median(xs) for name, xs in samples.items()}
    for name, secs in times.items():
        print(f"  {name:24} {secs:6.3f} s")
    for name in ("ptconvert", "ptconvert (table)"):
        print(f"  ratio {name} / picklescan: {times[name] / times['picklescan']:.2f}")


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
    ap.add_argument("--folder", action="store_true", help="Only the model folder scan.")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ptconvert-scanbench-"))
    if args.folder:
        cmds = tools(args.tools_venv, ("picklescan",))
        try:
            folder_timings(
                {k: cmds[k] for k in ("ptconvert", "ptconvert (table)", "picklescan")}, work
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    cmds = tools(args.tools_venv)
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
