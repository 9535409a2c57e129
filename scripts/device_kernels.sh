#!/usr/bin/env bash
# Kernel benchmarks on the device machine (build-device/ carried): `nibble bench kernels` and the
# torch BF16 baselines (dense matmul, MoE grouped_mm) in the same call; logs under $OUT, tables last.
# OPS=dense,moe M=... MOE_TOKENS=... select what runs.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
OPS=${OPS:-dense,moe}
M=${M:-1,2,4,8,16,64,128,8192}
MOE_TOKENS=${MOE_TOKENS:-1,4,16,64,128,512,2048,8192}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"
build-device/nibble bench kernels --ops "$OPS" --m "$M" --moe-tokens "$MOE_TOKENS" --json "$OUT/kernels.json" \
  > "$OUT/kernels.txt" 2>&1
case "$OPS" in *dense*) python3 bench/torch_linear_baseline.py --m "$M" > "$OUT/torch.txt" 2>&1 ;; esac
case "$OPS" in *moe*) python3 bench/torch_moe_baseline.py --tokens "$MOE_TOKENS" > "$OUT/torch_moe.txt" 2>&1 ;; esac
cat "$OUT/gpu.txt" "$OUT/kernels.txt" "$OUT"/torch*.txt
