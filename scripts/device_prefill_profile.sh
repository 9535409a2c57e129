#!/usr/bin/env bash
# Where a prefill step's GPU time goes, kernel by kernel: Nsight Compute's duration of every kernel
# of the last forward of `nibble bench latency --pp PP` (default 2048) on the full-size synthetic
# Qwen3-30B-A3B, summed by kernel name (ncu serializes launches: GPU time without launch gaps or
# PDL overlap). BIN picks the binary (default build-device/nibble); KERNEL, a regex, times only those
# kernels, LAST of them per forward. Run on the GPU machine with build-device/ carried; logs under
# $OUT, table last.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
synth_qwen3_full
PP=${PP:-2048}
BIN=${BIN:-build-device/nibble}
KERNEL=${KERNEL:-.}
tag=$(basename "$BIN")
timeout 400 ncu --clock-control none --csv --kernel-name "regex:$KERNEL" --metrics gpu__time_duration.sum "$BIN" bench latency \
  --model "$SYNTH_DIR" --backend cuda --pp "$PP" --tg 0 --batches "" --repeats 1 > "$OUT/ncu_prefill_$tag.csv" 2> "$OUT/ncu_prefill_$tag.err"
echo "== $BIN: pp$PP, one forward (W4A16, eager, kernels serialized by ncu)"
# The last forward: from its embedding, or the last LAST launches of the kernels timed.
start=embedding_kernel; [ "$KERNEL" != . ] && start=${LAST:?LAST: the launches of KERNEL in one forward}
ncu_kernel_table "$start" < "$OUT/ncu_prefill_$tag.csv" | head -26
