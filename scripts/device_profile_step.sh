#!/usr/bin/env bash
# Where a GPU step's time goes, op by op (NIBBLE_PROFILE_STEPS=1: eager steps timed with CUDA events;
# the MoE block split into its router, GEMMs and combine, a mixed step's attention into its two parts),
# on the full-size synthetic Qwen3-30B-A3B, one table per step kind and size. By default: prefill of
# 2048 tokens, single-stream decode, decode at 64 sequences with 1000-token contexts. RUNS, a list of
# `bench latency` argument sets separated by ";" (e.g. "--pp 1024 --tg 0 --batches 4,64 --mixed 1024"),
# replaces those; MODES (default none) picks the numerics where a run names none. Run on the GPU
# machine with build-device/ carried; logs under $OUT.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
synth_qwen3_full
RUNS=${RUNS:-"--pp 2048 --tg 64 --batches '' --repeats 5;--pp '' --tg 0 --batches 64 --batch-prompt 1000 --batch-gen 16"}
bench_runs
for i in "${!runs[@]}"; do
  log="$OUT/profile_$i.log"
  bench_run_args "${runs[$i]}"
  NIBBLE_PROFILE_STEPS=1 timeout 300 build-device/nibble bench latency --model "$SYNTH_DIR" --backend cuda \
    "${args[@]}" > "$log" 2>&1
  echo "== bench latency ${runs[$i]} (rc $?)"
  grep -vE "^\[nibble info\] (weights|GPU KV|CPU KV)" "$log" | sed 's/; /;\n    /g'
done
