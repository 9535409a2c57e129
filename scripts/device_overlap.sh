#!/usr/bin/env bash
# Overlapped scheduling on the GPU machine (build-device/ carried), issue 16: the same binary with and
# without it (--disable-overlap-schedule) on the full-size synthetic Qwen3-30B-A3B — `bench latency`
# decode rows, then `nibble serve --backend cuda` under one stream (128-token answers) and under
# workload 1's shape (NUM_PROMPTS chats of 1136 ± 50% in / 200 ± 50% out, 64 at a time), with the
# GPU's idle time between back-to-back steps from /metrics. Logs under $OUT; a table last.
# PARTS (default latency,serve) picks parts, VARIANTS (default "overlap no-overlap") the variants and
# SHAPES (default "single workload1") the serving shapes.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
PARTS=${PARTS:-latency,serve}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
synth_qwen3_full
rows=()

if has latency; then
  for variant in ${VARIANTS:-overlap no-overlap}; do
    flag=""; [ "$variant" = no-overlap ] && flag=--disable-overlap-schedule
    timeout 240 build-device/nibble bench latency --model "$SYNTH_DIR" --backend cuda --modes none --pp 512 --tg 128 \
      --batches 1,64,128 --batch-prompt 1000 --batch-gen 32 $flag > "$OUT/latency_$variant.log" 2>&1
    rows+=("latency $variant: $(grep -E '^none' "$OUT/latency_$variant.log" | awk '{printf "%s %s=%s  ", "", $2 ($3 ~ /^b/ ? $3 : ""), $(NF-1)}')")
  done
fi

# /metrics → "steps, engine us/step, device step ms, device idle us/step (share)".
step_metrics() {
  curl -s "localhost:$1/metrics" | sed 's/{[^}]*}//' | awk '{v[$1]=$2} END {
    s = v["nibble:engine_steps_total"]; d = v["nibble:device_steps_total"];
    if (s > 0) printf "steps %d, engine %.0f us/step", s, 1e6*v["nibble:step_engine_seconds_total"]/s;
    if (d > 0) printf ", device %.2f ms/step, idle %.1f us/step (%.2f%% of the step)", 1e3*v["nibble:device_step_seconds_total"]/d,
      1e6*v["nibble:device_idle_seconds_total"]/d, 100*v["nibble:device_idle_seconds_total"]/v["nibble:device_step_seconds_total"] }'
}

if has serve; then
  port=8770
  for variant in ${VARIANTS:-overlap no-overlap}; do
    flag=""; [ "$variant" = no-overlap ] && flag=--disable-overlap-schedule
    for shape in ${SHAPES:-single workload1}; do
      port=$((port + 1))
      build-device/nibble serve --backend cuda --model "$SYNTH_DIR" --port $port $flag > "$OUT/serve_${variant}_$shape.log" 2>&1 &
      pid=$!
      for _ in $(seq 1 180); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
      if [ "$shape" = single ]; then
        args="--num-prompts 16 --random-input-len 64 --random-output-len 128 --random-range-ratio 0 --max-concurrency 1"
      else
        args="--num-prompts ${NUM_PROMPTS:-400} --random-input-len 1136 --random-output-len 200 --random-range-ratio 0.5 --max-concurrency 64"
      fi
      timeout 300 build-device/nibble bench serve --port $port --backend openai-chat --tokenizer "$SYNTH_DIR" \
        --dataset-name random $args --ignore-eos --seed 0 --percentile-metrics ttft,tpot,itl,e2el,s_itl \
        --metric-percentiles 50,99 --disable-tqdm > "$OUT/bench_${variant}_$shape.txt" 2>&1
      rc=$?
      metrics=$(step_metrics $port)
      kill -TERM $pid; wait $pid
      out=$(grep -E "^Output token throughput" "$OUT/bench_${variant}_$shape.txt" | awk '{print $NF}')
      tpot=$(grep -E "^(P99 TPOT|Mean TPOT)" "$OUT/bench_${variant}_$shape.txt" | awk '{printf "%s=%s ", $1 $2, $NF}')
      rows+=("serve $variant $shape rc=$rc: output $out tok/s, $tpot| $metrics")
    done
  done
fi

echo "== overlapped scheduling A/B =="
printf '%s\n' "${rows[@]}"
