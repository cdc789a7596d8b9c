"""A model bigger than half the machine: a 7 B-class Llama directory in bf16 → verified pt2.

Builds (once, into --dir) a Hugging Face directory shaped like Llama-2-7B (hidden 4096, 32
layers, 32 heads, MLP 11008, vocabulary 32000) with random bf16 weights in 4 GB safetensors
shards — written shard by shard from the meta-device model's names and shapes, so building it
never holds more than one shard — then measures, one after the other:

- ``ptconvert DIR --to pt2 --dynamic-batch`` (verified, no cache);
- with ``--raw``, the raw API (``from_pretrained`` + ``torch.export`` with a dynamic batch and
  sequence + ``torch.export.save``); it may not fit, and then says so with its numbers.

For each: wall seconds, the peak memory owned by all the command's processes together
(anonymous pages, sampled every 20 ms, as benchmarks/programs.py measures it) and the largest
process's peak RSS, against the weights' size. Target: ptconvert's memory ≤ 1.2× the weights.
Run: ``.venv/bin/python benchmarks/big_model.py --dir /var/tmp/llama-7b [--raw]`` (about 14
GB of disk for the directory and as much for each output; tens of minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

from installed import as_installed
from programs import measure  # the all-process memory sampler

BIN = Path(sys.executable).parent

BUILD = """
import json, sys, torch, transformers
from pathlib import Path
from safetensors.torch import save_file
out = Path(sys.argv[1])
config = transformers.LlamaConfig(
    hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=32, vocab_size=32000, max_position_embeddings=2048,
    tie_word_embeddings=False, torch_dtype="bfloat16",
)
config.architectures = ["LlamaForCausalLM"]
with torch.device("meta"):
    model = transformers.LlamaForCausalLM(config)
shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
gen = torch.Generator().manual_seed(0)
shard, size, n, weight_map, total = {}, 0, 0, {}, 0
names = list(shapes)

def flush():
    global shard, size, n
    if not shard:
        return
    n += 1
    name = f"model-{n:05d}.safetensors"
    save_file(shard, str(out / name), metadata={"format": "pt"})
    weight_map.update({k: name for k in shard})
    shard, size = {}, 0

out.mkdir(parents=True, exist_ok=True)
for name in names:
    if name.endswith("norm.weight"):
        t = torch.ones(shapes[name], dtype=torch.bfloat16)
    else:
        t = (torch.randn(shapes[name], generator=gen) * 0.02).to(torch.bfloat16)
    shard[name] = t
    size += t.numel() * 2
    total += t.numel() * 2
    if size >= 4 * 10**9:
        flush()
flush()
index = {"metadata": {"total_size": total}, "weight_map": weight_map}
(out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
config.save_pretrained(out)
print(total)
"""

RAW = """
import sys, torch, transformers
src, out = sys.argv[1], sys.argv[2]
model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).eval()
model.config.use_cache = False
ids = torch.randint(0, 1000, (2, 16))
mask = torch.ones_like(ids)
batch, seq = torch.export.Dim("batch_size"), torch.export.Dim("sequence_length", max=2048)
shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
with torch.no_grad():
    ep = torch.export.export(
        model, (), {"input_ids": ids, "attention_mask": mask}, dynamic_shapes=shapes, strict=False
    )
torch.export.save(ep, out)
"""


def weights_bytes(directory: Path) -> int:
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    return int(index["metadata"]["total_size"])


def main() -> None:
    as_installed()
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--raw", action="store_true", help="also measure the raw API")
    args = ap.parse_args()
    src = args.dir / "llama-7b"
    if not (src / "model.safetensors.index.json").exists():
        subprocess.run([sys.executable, "-c", BUILD, str(src)], check=True)
    size = weights_bytes(src)
    out = args.dir / "llama-7b.pt2"
    cmd = [str(BIN / "ptconvert"), str(src), "--to", "pt2", "--dynamic-batch", "-o", str(out)]
    report = args.dir / "report.json"
    line = " ".join([*map(shlex.quote, cmd), "--no-cache", "--json"])
    runs = {"ptconvert (verified)": ["sh", "-c", f"exec {line} > {shlex.quote(str(report))}"]}
    if args.raw:
        raw = args.dir / "raw.py"
        raw.write_text(RAW)
        runs["raw API"] = [sys.executable, str(raw), str(src), str(args.dir / "raw.pt2")]
    print(f"Llama-7B-shaped, bf16 weights {size / 2**30:.1f} GiB")
    print("memory: owned by all processes (anonymous pages); RSS: the largest process's peak;")
    print("RSS summed: all processes' resident pages, file pages mapped twice counted twice")
    head = f"{'':22} {'wall s':>7} {'memory GiB':>11} {'RSS GiB':>8} {'RSS summed':>11}"
    print(f"{head} {'×weights':>9} {'RSS ×w':>7}")
    for name, command in runs.items():
        try:
            seconds, rss, owned, summed = measure(command, [out, args.dir / "raw.pt2"])
        except SystemExit as exc:
            print(f"{name:22} {exc}")
            continue
        print(
            f"{name:22} {seconds:7.0f} {owned / 1024:11.1f} {rss / 1024:8.1f} "
            f"{summed / 1024:11.1f} {owned * 2**20 / size:9.2f} {rss * 2**20 / size:7.2f}"
        )
    print("target: ptconvert's memory (all processes) ≤ 1.2× the weights")
    if report.exists() and report.stat().st_size:
        done = json.loads(report.read_text())
        steps = ", ".join(f"{s['step']} {s['seconds']:.0f} s" for s in done["steps"])
        print(f"ptconvert's steps: {steps}; in all {done['seconds']:.0f} s")
        for note in done.get("notes", []):
            print(f"  note: {note}")


if __name__ == "__main__":
    main()
