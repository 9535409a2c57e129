#!/usr/bin/env bash
# A kernel-iteration device call (build-device/ carried): every GPU test, `nibble bench kernels` on
# the decode-size shapes for every backend, and `nibble bench latency` (W4A16) on the full-size
# synthetic Qwen3-30B-A3B with and without programmatic dependent launch. Logs under $OUT, a short
# table last. M=..., MOE_TOKENS=..., MODES=... override what runs.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
M=${M:-1,4,16,32,64}
MOE_TOKENS=${MOE_TOKENS:-1,4,16,32,64,128}
MODES=${MODES:-none}
results=()
for t in build-device/tests/test_cuda_*; do
  name=$(basename "$t")
  "$t" > "$OUT/$name.log" 2>&1
  results+=("$(printf '%-22s rc=%d  %s' "$name" "$?" "$(grep -E "^\[  (PASSED|FAILED) " "$OUT/$name.log" | tr '\n' ' ')")")
done
build-device/nibble bench kernels --ops dense,moe --m "$M" --moe-tokens "$MOE_TOKENS" --gemm-backend all \
  --moe-backend all --json "$OUT/kernels.json" > "$OUT/kernels.txt" 2>&1
SLICE_DIR=/tmp/qwen3-30b-a3b-4l
synth_qwen3_full
build-device/nibble synth --preset qwen3-30b-a3b --layers 4 --out "$SLICE_DIR" --seed 1 > "$OUT/synth4.log" 2>&1
NIBBLE_TEST_MODEL="$SLICE_DIR" build-device/tests/test_cuda_runner --gtest_filter='*MatchesTheCpu*' > "$OUT/runner_4layer.log" 2>&1
results+=("$(printf '%-22s rc=%d  %s' "runner vs cpu, 4 layers" "$?" "$(grep -E '^mode' "$OUT/runner_4layer.log" | tr '\n' ' ')")")
for pdl in 0 1; do
  NIBBLE_NO_PDL=$pdl build-device/nibble bench latency --model "$SYNTH_DIR" --backend cuda --modes "$MODES" \
    --pp 512,2048 --tg 128 --batches 1,16,64,128 --batch-prompt 1000 --batch-gen 32 \
    --json "$OUT/latency_nopdl$pdl.json" > "$OUT/latency_nopdl$pdl.log" 2>&1
  results+=("$(printf '%-22s rc=%d' "bench latency NIBBLE_NO_PDL=$pdl" "$?")")
done
for t in "$OUT"/test_cuda_*.log; do grep -hE "Failure|Expected|actual|error" "$t" | head -6; done
grep -E "^(linear|moe) " "$OUT"/test_cuda_*.log | grep -E "skinny" | sort -k6 -g | tail -4
printf '%s\n' "${results[@]}"
grep -E "w4a16|^op" "$OUT/kernels.txt"
for pdl in 0 1; do echo "-- NIBBLE_NO_PDL=$pdl"; grep -vE "^\[nibble" "$OUT/latency_nopdl$pdl.log" | tail -12; done
