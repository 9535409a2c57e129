#!/usr/bin/env bash
# Where one decode step's GPU time goes, kernel by kernel: Nsight Compute's duration of every kernel
# of the last step of `nibble generate --enforce-eager` (single sequence) on the full-size synthetic
# Qwen3-30B-A3B, summed by kernel (launches run one at a time under ncu, so this is GPU time without
# launch gaps or PDL overlap). Then the MoE block's kernels at T = 1 and 16 from `bench kernels`.
# Run on the GPU machine with build-device/ carried; logs under $OUT, tables last.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
synth_qwen3_full
ncu --clock-control none --csv --metrics gpu__time_duration.sum build-device/nibble generate --model "$SYNTH_DIR" \
  --backend cuda --enforce-eager --prompt-ids 1,2,3 --max-tokens 3 > "$OUT/ncu_decode.csv" 2> "$OUT/ncu_decode.err"
for T in 1 16; do
  ncu --clock-control none --csv --metrics gpu__time_duration.sum --launch-count 8 build-device/nibble bench kernels \
    --ops moe --moe-tokens "$T" --moe-backend skinny --iterations 1 --batches 1 > "$OUT/ncu_moe_$T.csv" 2>&1
done
echo "== decode step, 1 sequence (W4A16, eager, kernels serialized by ncu)"
ncu_kernel_table embedding_kernel < "$OUT/ncu_decode.csv"
for T in 1 16; do echo "== MoE block T=$T, skinny"; ncu_kernel_table route_group < "$OUT/ncu_moe_$T.csv"; done
