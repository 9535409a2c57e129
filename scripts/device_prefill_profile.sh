#!/usr/bin/env bash
# Where a prefill step's GPU time goes, kernel by kernel: Nsight Compute's duration of every kernel
# of the last forward of `nibble bench latency --pp PP` (default 2048) on the full-size synthetic
# Qwen3-30B-A3B, summed by kernel name (ncu serializes launches: GPU time without launch gaps or
# PDL overlap). Run on the GPU machine with build-device/ carried; logs under $OUT, table last.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
synth_qwen3_full
PP=${PP:-2048}
timeout 400 ncu --clock-control none --csv --metrics gpu__time_duration.sum build-device/nibble bench latency \
  --model "$SYNTH_DIR" --backend cuda --pp "$PP" --tg 0 --batches "" --repeats 1 > "$OUT/ncu_prefill.csv" 2> "$OUT/ncu_prefill.err"
echo "== pp$PP, one forward (W4A16, eager, kernels serialized by ncu)"
ncu_kernel_table embedding_kernel < "$OUT/ncu_prefill.csv" | head -26
