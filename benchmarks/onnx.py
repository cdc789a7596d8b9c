"""ONNX export: ptconvert against Hugging Face optimum's exporter, in one run.

optimum's ONNX exporter (``optimum-cli export onnx``, in the ``optimum-onnx`` package since
optimum 2) needs an older transformers than this project's, so it runs from a venv of its own
(``--venv``, default ``.venv-optimum`` at the repo root), the one ``tools/client_venv.py``
builds for the clients' tests too (its ``OPTIMUM_PINS``, the CPU-torch check, the stamp file
that makes a rerun reuse it; ``rm -r .venv-optimum`` builds it again).

Tiny random-weight Hugging Face directories (safetensors, saved with this project's
transformers; optimum's loads each of them, every tensor equal, before any timing) for BERT,
GPT-2, T5 and ViT. No tokenizer or preprocessor files: optimum's exporter makes its dummy
inputs from the config and exports without them. For each case, wall time and peak RSS (the
largest process of the tree, ``os.wait4``'s ``ru_maxrss``) of

- optimum: ``optimum-cli export onnx --model DIR --task TASK OUT`` (its default validation
  against the PyTorch model, default atol; the with-past tasks also merge the decoders);
- ptconvert: ``ptconvert DIR --to onnx --dynamic-batch -o OUT --force --json`` for the cache-free
  tasks, ``--task text-generation-with-past`` / ``--task text2text-generation-with-past`` for
  the cached ones (default verification: parity at batch sizes 1-7 and the dynamic dims' ends,
  or 16 greedy tokens generated at batch 1 and 2 against transformers' ``generate``), with
  ``--no-cache`` unless ``--cache``: ptconvert keeps each verified program, so every run after
  the warm-up would otherwise copy it from its cache instead of exporting.

Cases: BERT feature-extraction, GPT-2 text-generation and text-generation-with-past, T5
text2text-generation-with-past, ViT image-classification. Every command runs once untimed
(warm-up), then ``--repeats`` rounds interleave all commands (median wall time, highest peak
RSS). Prints the table (target: ptconvert ≤ 1.0× optimum) and ptconvert's own split of its
time from each run's ``--json`` report: its steps, the verification (the report's seconds less
its steps) and the process around them (start-up, imports, exit: wall less the report's
seconds). A generation report carries no step times: only the last two are printed there.

``bert-ts`` and ``gpt2-past-ts`` are those cases with ``--onnx-exporter torchscript``: the
exporter optimum-cli runs, a trace, against the same optimum-cli command.

Run: ``.venv/bin/python benchmarks/onnx.py [--repeats 3] [--cases bert,gpt2-past] [--dir DIR]``.
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
from dataclasses import dataclass, field
from pathlib import Path

from installed import as_installed
from rows import emit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import client_venv  # tools/client_venv.py: the venv's pins and its builder

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the project's venv (.venv/bin)
REPEATS = 3


BUILD = """
import sys
from pathlib import Path

import torch
import transformers as t

out = Path(sys.argv[1])
models = {
    "bert": (
        t.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=37, max_position_embeddings=64),
        t.BertModel,
    ),
    "gpt2": (
        t.GPT2Config(vocab_size=99, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                     bos_token_id=0, eos_token_id=0),
        t.GPT2LMHeadModel,
    ),
    "t5": (
        t.T5Config(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                   decoder_start_token_id=0),
        t.T5ForConditionalGeneration,
    ),
    "vit": (
        t.ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=32,
                    num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                    num_labels=3),
        t.ViTForImageClassification,
    ),
}
for name in sys.argv[2:]:
    config, cls = models[name]
    torch.manual_seed(0)
    cls(config).eval().save_pretrained(out / name)
"""

# optimum's transformers loads what ours saved: no key missing or unexpected, every tensor equal
LOADS = """
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file

for arg in sys.argv[1:]:
    path = Path(arg)
    config = transformers.AutoConfig.from_pretrained(path)
    cls = getattr(transformers, config.architectures[0])
    model, info = cls.from_pretrained(path, output_loading_info=True)
    state = model.state_dict()
    saved = load_file(path / "model.safetensors")
    bad = {k: v for k, v in info.items() if v}
    bad.update(differ=[k for k, v in saved.items() if k in state and not torch.equal(v, state[k])])
    bad.update(unknown=[k for k in saved if k not in state])
    if any(bad.values()):
        sys.exit(f"{path.name}: optimum's transformers loads it differently: {bad}")
"""


@dataclass
class Case:
    name: str
    model: str
    task: str  # optimum's --task
    pt_args: list[str]  # ptconvert's options beside -o/--force/--json
    pt_out: str  # ptconvert's output name (a file, or a folder for seq2seq)
    opt_runs: list[tuple[float, float]] = field(default_factory=list)
    pt_runs: list[tuple[float, float]] = field(default_factory=list)
    reports: list[tuple[float, dict]] = field(default_factory=list)  # (wall, --json report)


def cases() -> list[Case]:
    graph = ["--to", "onnx", "--dynamic-batch"]
    return [
        Case("bert", "bert", "feature-extraction", graph, "bert.onnx"),
        # the exporter optimum-cli runs (a trace), asked for by name
        Case(
            "bert-ts",
            "bert",
            "feature-extraction",
            [*graph, "--onnx-exporter", "torchscript"],
            "bert-ts.onnx",
        ),
        Case("gpt2", "gpt2", "text-generation", graph, "gpt2.onnx"),
        Case(
            "gpt2-past",
            "gpt2",
            "text-generation-with-past",
            ["--to", "onnx", "--task", "text-generation-with-past"],
            "gpt2-past.onnx",
        ),
        Case(
            "gpt2-past-ts",
            "gpt2",
            "text-generation-with-past",
            [
                "--to",
                "onnx",
                "--task",
                "text-generation-with-past",
                "--onnx-exporter",
                "torchscript",
            ],
            "gpt2-past-ts.onnx",
        ),
        Case(
            "t5-past",
            "t5",
            "text2text-generation-with-past",
            ["--to", "onnx", "--task", "text2text-generation-with-past"],
            "t5-past-onnx",
        ),
        Case("vit", "vit", "image-classification", graph, "vit.onnx"),
    ]


def setup_venv(venv: Path) -> Path:
    """The optimum venv (tools/client_venv.py's, shared with tests/clients), made or reused;
    returns its optimum-cli."""
    return client_venv.setup_venv(venv).with_name("optimum-cli")


def measure(cmd: list[str], out: Path, log: Path) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one command, its output removed first; stdout to ``log``
    (ptconvert's --json report), stderr beside it."""
    if out.is_dir():
        shutil.rmtree(out)
    out.unlink(missing_ok=True)
    with log.open("wb") as stdout, log.with_suffix(".err").open("wb") as stderr:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, cwd=out.parent)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        tail = log.with_suffix(".err").read_text(errors="replace")[-2000:]
        raise SystemExit(f"failed: {' '.join(map(str, cmd))}\n{tail}")
    return elapsed, usage.ru_maxrss / 1024


def run_case(case: Case, cli: Path, models: Path, work: Path, *, timed: bool, cache: bool) -> None:
    src = models / case.model
    opt_out = work / f"optimum-{case.name}"
    pt_out = work / case.pt_out
    opt_cmd = [str(cli), "export", "onnx", "--model", str(src), "--task", case.task, str(opt_out)]
    pt_cmd = [str(BIN / "ptconvert"), str(src), *case.pt_args, "-o", str(pt_out)]
    pt_cmd += ["--force", "--json", *([] if cache else ["--no-cache"])]
    opt = measure(opt_cmd, opt_out, work / f"optimum-{case.name}.log")
    log = work / f"ptconvert-{case.name}.json"
    pt = measure(pt_cmd, pt_out, log)
    if timed:
        case.opt_runs.append(opt)
        case.pt_runs.append(pt)
        case.reports.append((pt[0], json.loads(log.read_text())))


def median(values: list[float]) -> float:
    return statistics.median(values)


def split(case: Case) -> str:
    """ptconvert's time by the report: median of each step, the verification, the process."""
    parts: dict[str, list[float]] = {}
    for wall, report in case.reports:
        steps = report.get("steps") or []
        for step in steps:
            parts.setdefault(step["step"], []).append(step["seconds"])
        inside = sum(step["seconds"] for step in steps)
        check = report.get("check", "?")
        key = f"verification ({check})" if steps else f"export + verification ({check})"
        parts.setdefault(key, []).append(report["seconds"] - inside)
        parts.setdefault("process (start-up, imports, exit)", []).append(wall - report["seconds"])
    text = ", ".join(f"{name} {median(v):.2f}" for name, v in parts.items())
    hits = sum(1 for _, report in case.reports if report.get("cached"))
    return text + (f" ({hits} of {len(case.reports)} runs were cache hits)" if hits else "")


def print_results(selected: list[Case]) -> None:
    print(f"\n{os.cpu_count()} cores; median of {len(selected[0].pt_runs)} rounds")
    head = f"{'model / task':42} {'optimum s':>9} {'ptconvert s':>11} {'ratio':>6} {'target':>7}"
    print(f"{head} {'':7} {'RSS MiB opt / ptc':>18}")
    for case in selected:
        opt = median([r[0] for r in case.opt_runs])
        pt = median([r[0] for r in case.pt_runs])
        ratio = pt / opt
        verdict = "met" if ratio <= 1.0 else "NOT met"
        opt_rss = max(r[1] for r in case.opt_runs)
        pt_rss = max(r[1] for r in case.pt_runs)
        label = f"{case.model} {case.task}" + (
            " (TorchScript's exporter)" if case.name.endswith("-ts") else ""
        )
        emit(f"tiny {label} → verified ONNX", "optimum-cli export onnx", opt, ratio, 1.0, "×")
        print(
            f"{label:42} {opt:9.2f} {pt:11.2f} {ratio:5.2f}× {'≤ 1.0×':>7} {verdict:7} "
            f"{opt_rss:8.0f} / {pt_rss:.0f}"
        )
    print("\nptconvert's seconds by its --json report (medians):")
    for case in selected:
        print(f"  {case.name}: {split(case)}")


def main() -> None:
    as_installed()
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--repeats", type=int, default=REPEATS, help="timed rounds (median)")
    ap.add_argument("--venv", type=Path, default=REPO / ".venv-optimum", help="optimum's venv")
    ap.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp one)")
    ap.add_argument(
        "--cache",
        action="store_true",
        help="let ptconvert use its cache of verified programs (default --no-cache: after the "
        "warm-up every graph conversion would be a cache hit, timing a copy)",
    )
    names = [c.name for c in cases()]
    ap.add_argument("--cases", default=",".join(names), help=f"comma-separated: {names}")
    args = ap.parse_args()
    wanted = args.cases.split(",")
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        ap.error(f"unknown cases {unknown}; known: {names}")
    selected = [c for c in cases() if c.name in wanted]
    cli = setup_venv(args.venv.resolve())
    work = Path(tempfile.mkdtemp(prefix="ptconvert-onnx-bench-", dir=args.dir)).resolve()
    try:
        models = work / "models"
        model_names = sorted({c.model for c in selected})
        subprocess.run([sys.executable, "-c", BUILD, models, *model_names], check=True, cwd=work)
        dirs = [models / m for m in model_names]
        subprocess.run([args.venv / "bin" / "python", "-c", LOADS, *dirs], check=True, cwd=work)
        for case in selected:  # warm-up: page cache, imports, and a check that each one runs
            run_case(case, cli, models, work, timed=False, cache=args.cache)
        for _ in range(args.repeats):  # interleaved: load on the machine hits all alike
            for case in selected:
                run_case(case, cli, models, work, timed=True, cache=args.cache)
        print_results(selected)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
