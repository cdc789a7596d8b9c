#!/usr/bin/env bash
# The CUDA checks, for a machine with a GPU (run from the repository root after `make setup`,
# with a CUDA build of torch): a HF model converted to pt2, verified with the candidate on the
# GPU against the CPU fp64-backed reference, and timed (eager, torch.compile, pt2) on the GPU;
# the same model compiled by AOTInductor for CUDA and checked (its runtime on the GPU against
# eager on the CPU) and an ONNX file run on onnxruntime's CUDA provider where it has one.
# Results land as JSON in $OUT (default gpu-out/).
set -euo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
bin=.venv/bin
"$bin/python" -c "import torch; assert torch.cuda.is_available(), 'no CUDA'; print(torch.cuda.get_device_name())"
"$bin/python" -m fixtures.build "$out/fixtures" > /dev/null
"$bin/ptconvert" "$out/fixtures/hf-llama" --to pt2 --dynamic-batch -o "$out/llama.pt2" --force --json > "$out/convert.json"
"$bin/ptconvert" verify "$out/fixtures/hf-llama" "$out/llama.pt2" --device cuda --json > "$out/verify.json"
"$bin/ptconvert" bench "$out/llama.pt2" --reference "$out/fixtures/hf-llama" --device cuda \
  --batch-sizes 1,8,32 --json > "$out/bench.json"
"$bin/ptconvert" "$out/fixtures/hf-llama" --to aoti --device cuda --dynamic-batch \
  -o "$out/llama.aoti.pt2" --force --json > "$out/convert-aoti-cuda.json"
"$bin/ptconvert" "$out/fixtures/hf-llama" --to onnx --device cuda --dynamic-batch \
  -o "$out/llama.onnx" --force --json > "$out/convert-onnx-cuda.json"
echo "results in $out/"
