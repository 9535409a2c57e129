#!/usr/bin/env bash
# One device call (build-device/ carried) deciding --decode-attention: the GPU runner tests (the
# tensor-core decode path against the split-KV kernel among them), then `nibble bench latency` on the
# full-size synthetic Qwen3-30B-A3B with each choice (single-stream and batched decode with
# 1000-token prompts; decode attention was 43% of a 64-sequence step). Logs under $OUT, a table last.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
build-device/tests/test_cuda_runner > "$OUT/test_cuda_runner.log" 2>&1
echo "test_cuda_runner rc=$? $(grep -E "^\[  (PASSED|FAILED) " "$OUT/test_cuda_runner.log" | tr '\n' ' ')"
grep -hE "Failure|Expected|actual|error" "$OUT/test_cuda_runner.log" | head -8
synth_qwen3_full
for choice in split-kv tensor-core; do
  build-device/nibble bench latency --model "$SYNTH_DIR" --backend cuda --modes none --pp 2048 --tg 128 \
    --batches 1,16,64,128 --batch-prompt 1000 --batch-gen 32 --decode-attention "$choice" \
    --json "$OUT/latency_$choice.json" > "$OUT/latency_$choice.log" 2>&1
  echo "-- --decode-attention $choice (rc=$?)"
  grep -vE "^\[nibble" "$OUT/latency_$choice.log" | tail -8
done
(cd "$OUT" && tar -czf 0logs.tar.gz ./*.log ./*.json 2> /dev/null)
