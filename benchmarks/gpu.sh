#!/usr/bin/env bash
# GPU check for posemb's Triton RoPE kernel: tests against the reference, then the benchmarks
# (the kernel alone, and inside a transformers Llama).
# Meant for the lent H200 (no network there; its image has torch, triton, transformers,
# pytest, hypothesis, safetensors). Finishes in well under 5 minutes.
#
# Optional comparison libraries travel as wheels in .whl/ (carry it), fetched here with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl liger-kernel rotary-embedding-torch
# Results land in $OUT (or ./gpu-results when run elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-results}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"

if compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/posemb-site .whl/*.whl
    export PYTHONPATH="$PYTHONPATH:/tmp/posemb-site"
fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
    | tee -a "$OUT/gpu.txt"

# 1. Correctness on the GPU: every kernel test runs its CUDA variant when a GPU is present,
# opcheck runs all of its checks on the Triton ops (fake tensors included, which the CPU
# interpreter cannot), and the Llama block compiles and exports with the Triton backend.
timeout 130 "$PY" -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_rope.py \
    tests/test_compile.py 2>&1 | tee "$OUT/tests.txt"

# 2. Speed: all shapes, fp32 and bf16, forward/backward/both, against a device copy.
timeout 100 "$PY" -m posemb bench --device cuda --out "$OUT/bench-gpu.csv" 2>&1 \
    | tee "$OUT/bench-gpu.txt"

# 3. End to end: a transformers Llama decoder layer and a 4-layer model, eager against
# patch_rotary, patch_rotary(fused=True) (the Triton op) and Liger's rotation, in bf16 as
# GPUs train, forward and forward+backward, with the rotation's share of each step.
timeout 60 "$PY" -m posemb bench --hf --device cuda --dtype bf16 --out "$OUT/bench-hf-gpu.csv" \
    2>&1 | tee "$OUT/bench-hf-gpu.txt"

# 4. Decode: one token per step at Llama 3.1 8B's attention shapes, batch 1 and 8, posemb's
# module, kernels.rotate and the fused patch against transformers, per layer and per step (the
# CPU fast paths do not apply on CUDA: this measures the Triton op's launches), then QK-norm +
# RoPE at prefill shapes.
timeout 60 "$PY" -m posemb bench --decode --device cuda --repeats 50 \
    --out "$OUT/bench-decode-gpu.csv" 2>&1 | tee "$OUT/bench-decode-gpu.txt"
timeout 60 "$PY" -m posemb bench --norm --device cuda --out "$OUT/bench-norm-gpu.csv" 2>&1 \
    | tee "$OUT/bench-norm-gpu.txt"
