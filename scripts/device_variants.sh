#!/usr/bin/env bash
# One device call (build-device/ carried) comparing kernel variants chosen by environment: for each
# VARIANTS entry (e.g. "NIBBLE_MOE_STREAM=1,NIBBLE_STREAM_STAGES=3"; "base" for none) the GPU kernel
# tests, the BACKEND rows of `nibble bench kernels` (OPS, M, MOE_TOKENS) and, with LATENCY set (bench
# latency flags), `nibble bench latency` on the full-size synthetic Qwen3-30B-A3B, and with SERVE=1
# `nibble serve --backend cuda` under workload 1's shape (NUM_PROMPTS chats, default 300, of 1136 ± 50%
# in / 200 ± 50% out, 64 at a time). TESTS="" skips the tests, KERNELS=0 the kernel rows. Short table last.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
BACKEND=${BACKEND:-skinny}
OPS=${OPS:-moe}
M=${M:-1,4,16,64}
MOE_TOKENS=${MOE_TOKENS:-1,4,16,64,128,256}
TESTS=${TESTS-test_cuda_moe}
results=()
{ [ -n "${LATENCY:-}" ] || [ "${SERVE:-0}" = 1 ]; } && synth_qwen3_full
port=8780
for v in ${VARIANTS:-base}; do
  vars=""; [ "$v" != base ] && vars="${v//,/ }"
  name=$(printf '%s' "$v" | tr '=,' '-_')  # log names the device tool brings back
  for t in $TESTS; do
    env $vars timeout 200 "build-device/tests/$t" > "$OUT/${t}_$name.log" 2>&1
    results+=("$(printf '%-48s rc=%d  %s' "$t $v" "$?" "$(grep -E "^\[  (PASSED|FAILED) " "$OUT/${t}_$name.log" | tr '\n' ' ')")")
  done
  if [ "${KERNELS:-1}" = 1 ]; then
    env $vars timeout 200 build-device/nibble bench kernels --ops "$OPS" --m "$M" --moe-tokens "$MOE_TOKENS" \
      --gemm-backend "$BACKEND" --moe-backend "$BACKEND" > "$OUT/kernels_$name.txt" 2>&1
    results+=("$(printf '%-48s rc=%d  %s' "kernels $v" "$?" "$(awk -v b="$BACKEND/w4a16" '$3 == b {printf "%s:%s=%s ", $1, $2, $4}' "$OUT/kernels_$name.txt")")")
  fi
  if [ -n "${PROFILE_KERNEL:-}" ]; then
    # shellcheck disable=SC2086
    results+=("$(printf '%-48s %s' "profile $v" "$( (for kv in $vars; do export "$kv"; done; key_metrics "$OUT/profile_$name.csv" build-device/nibble $PROFILE_ARGS) )")")
  fi
  if [ -n "${LATENCY:-}" ]; then
    # shellcheck disable=SC2086
    env $vars timeout 240 build-device/nibble bench latency --model "$SYNTH_DIR" --backend cuda --batch-prompt 1000 \
      --batch-gen 32 $LATENCY > "$OUT/latency_$name.log" 2>&1
    results+=("$(printf '%-48s rc=%d  %s' "latency $v" "$?" "$(awk '$2 ~ /^(pp|tg)[0-9]/ {printf "%s/%s=%s ", $1, $2, $4} $2 == "S_TG" {printf "%s/%s=%s ", $1, $3, $5}' "$OUT/latency_$name.log")")")
  fi
  if [ "${SERVE:-0}" = 1 ]; then
    port=$((port + 1))
    env $vars build-device/nibble serve --backend cuda --model "$SYNTH_DIR" --port $port > "$OUT/serve_$name.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 180); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
    timeout 300 build-device/nibble bench serve --port $port --backend openai-chat --tokenizer "$SYNTH_DIR" \
      --dataset-name random --num-prompts "${NUM_PROMPTS:-300}" --random-input-len 1136 --random-output-len 200 \
      --random-range-ratio 0.5 --max-concurrency 64 --ignore-eos --seed 0 --percentile-metrics ttft,tpot,itl,e2el \
      --metric-percentiles 50,99 --disable-tqdm > "$OUT/workload1_$name.txt" 2>&1
    rc=$?
    kill -TERM $pid; wait $pid
    results+=("$(printf '%-48s rc=%d  output %s tok/s, %s' "workload1 $v" "$rc" \
      "$(awk '/^Output token throughput/ {print $NF}' "$OUT/workload1_$name.txt")" \
      "$(awk '/^(P99 TPOT|Median TTFT)/ {printf "%s=%s ", $1 $2, $NF}' "$OUT/workload1_$name.txt")")")
  fi
done
for t in "$OUT"/test_cuda_*.log; do grep -hE "Failure|Expected|actual|error|Which is" "$t" | head -6; done
printf '%s\n' "${results[@]}"
