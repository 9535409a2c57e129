#!/usr/bin/env bash
# Where a GPU step's time goes, op by op (NIBBLE_PROFILE_STEPS=1: eager steps timed with CUDA events),
# on the full-size synthetic Qwen3-30B-A3B: prefill of 2048 tokens, single-stream decode, and decode
# at 64 sequences with 1000-token contexts. Run on the GPU machine with build-device/ carried.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
synth_qwen3_full
NIBBLE_PROFILE_STEPS=1 build-device/nibble bench latency --model "$SYNTH_DIR" --backend cuda --pp 2048 --tg 64 \
  --batches "" --repeats 5 > "$OUT/profile_single.log" 2>&1
NIBBLE_PROFILE_STEPS=1 build-device/nibble bench latency --model "$SYNTH_DIR" --backend cuda --pp "" --tg 0 \
  --batches 64 --batch-prompt 1000 --batch-gen 16 > "$OUT/profile_b64.log" 2>&1
echo "== single sequence: pp2048 (prefill) and tg64 (decode)"
grep -vE "^\[nibble info\] (weights|GPU KV|CPU KV)" "$OUT/profile_single.log" | sed 's/; /;\n    /g'
echo "== 64 sequences, 1000-token contexts (prefill steps of 8192 tokens; decode steps of 64)"
grep -vE "^\[nibble info\] (weights|GPU KV|CPU KV)" "$OUT/profile_b64.log" | sed 's/; /;\n    /g'
