"""What the check costs beside the steps it checks, on the tiny models of the test corpus.

Converts every tiny Hugging Face directory that ``fixtures.build`` writes (BERT, GPT-2, Llama,
ViT, T5, Whisper), a tiny Swin and SAM2 (random weights, written here: windows, an image's
height and width made dynamic, the models issue 43's checks never finished on) and the bundled
MLP ``--to pt2`` and ``--to onnx`` with ``--dynamic-batch``
(no cache), once with ``--no-verify`` and once verified, and prints from the ``--json`` reports
the route's steps' seconds (unverified), what verifying adds to the run (the verified run's
seconds less the unverified one's: eager runs, the program at each size, probes of every
dynamic dim, the fresh process or runtime, and a step refused and taken again) and their
ratio. Target: the check never costs more than the steps (ratio ≤ 1.0): the run exits 1
when one does.

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
MODELS = ["mlp", "bert", "gpt2-bin", "llama", "vit", "t5", "whisper", "swin", "sam2"]

# tiny configs of the models written here (transformers' classes and config keywords)
_WINDOWED = """
import sys, torch, transformers as t
out, kind = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
if kind == "swin":
    config = t.SwinConfig(image_size=32, patch_size=4, embed_dim=8, depths=[1, 1],
                          num_heads=[1, 1], window_size=2, num_labels=3)
    model = t.SwinForImageClassification(config)
elif not hasattr(t, "Sam2Model"):
    sys.exit(3)
else:
    vision = dict(
        backbone_config=dict(
            model_type="sam2_hiera_det_model", hidden_size=8, num_attention_heads=1,
            image_size=[64, 64], blocks_per_stage=[1, 1, 2, 1],
            embed_dim_per_stage=[8, 16, 32, 64], num_attention_heads_per_stage=[1, 1, 1, 1],
            window_size_per_stage=[4, 4, 4, 2], global_attention_blocks=[3],
            window_positional_embedding_background_size=[4, 4]),
        backbone_channel_list=[64, 32, 16, 8],
        backbone_feature_sizes=[[16, 16], [8, 8], [4, 4]], fpn_hidden_size=16)
    config = t.Sam2Config(
        vision_config=vision,
        prompt_encoder_config=dict(hidden_size=16, image_size=64, patch_size=16,
                                   mask_input_channels=4),
        mask_decoder_config=dict(hidden_size=16, mlp_dim=32, num_hidden_layers=1,
                                 num_attention_heads=2, iou_head_hidden_dim=16))
    model = t.Sam2Model(config)
model.eval().config.architectures = [type(model).__name__]
model.save_pretrained(out)
"""


def build(work: Path) -> dict[str, Path]:
    code = f"import pathlib, fixtures.build as b; b.build_all(pathlib.Path({str(work)!r}))"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True)
    found = {name: work / f"hf-{name}" for name in MODELS if (work / f"hf-{name}").is_dir()}
    found["mlp"] = work / "mlp.pt"
    for kind in ("swin", "sam2"):
        out = work / f"hf-{kind}"
        made = subprocess.run([sys.executable, "-c", _WINDOWED, str(out), kind], cwd=ROOT)
        if made.returncode == 0:
            found[kind] = out
        else:
            print(f"{kind}: not built (this transformers has no {kind} model class)")
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
            if name not in sources:
                continue
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
    if worst > 1.0:
        sys.exit(1)


if __name__ == "__main__":
    main()
