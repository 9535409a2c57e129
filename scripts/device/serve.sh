# `scripts/device.sh serve`: serving workloads on the GPU machine. Workload 1: FastDeploy's NVFP4 MoE PR
# benchmark shape — chat requests of ShareGPT's lengths (~1136 input / ~200 output tokens, spread
# ±50%), MAX_CONCURRENCY (64) at a time, --ignore-eos — against nibble serve --backend cuda on the
# full-size synthetic Qwen3-30B-A3B, with vLLM's client-side and FastDeploy's server-side metrics, then the engine's step
# timers and a summary of its steps (--step-log). NUM_PROMPTS (1000); CONFIGS: the serve configurations
# to run it under, one server each — "default" or serve flags joined by commas, e.g.
# "--max-num-batched-tokens=4096,--scheduler-delay-factor=2" (default: "default"); SERVE_ARGS: flags
# for every server; WORKLOAD2=1 adds issue 16's workload 2 (gsm8k, 1,209 in parallel) on the last
# server; STRUCTURED=1 adds, on the last server, scripts/structured_smoke.py (64 constrained and
# unconstrained requests mixed, each output checked; STRUCTURED_SMOKE_ROUNDS (1) rounds of them),
# then 64 chats at a time (random 1,000 in / 200 out, STRUCTURED_PROMPTS of them) unconstrained and
# under `--structured json-schema`, STRUCTURED_ROUNDS (2) times each (issue 67's 0.95× target, the
# GPU's idle share, the mask time a row); WORKLOAD1=0 skips workload 1. Overlapped scheduling on
# and off, for one: CONFIGS="default --disable-overlap-schedule". A configuration's NAME=VALUE items
# are its server's environment. FIRST=1: each server's first four requests (16 to 3,000 prompt
# tokens, one at a time) timed, e.g. CONFIGS="default --skip-server-warmup CUDA_MODULE_LOADING=EAGER".
synth_full

start_server() {  # start_server LOG [NAME=VALUE settings and serve flags...]
  local log=$1 vars flags; shift
  split_settings "$@"
  env "${vars[@]}" build-device/nibble serve --backend cuda --model "$SYNTH_DIR" --port 8766 \
    --max-num-seqs "${MAX_NUM_SEQS:-256}" ${SERVE_ARGS:-} "${flags[@]}" > "$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 180); do curl -sf localhost:8766/health >/dev/null && break; sleep 1; done
}

# The engine's step timers: its own time against the runner's (the device's wait share between
# back-to-back steps, issue 16's "GPU idle between decode steps").
step_timers() {
  curl -s localhost:8766/metrics | grep -E "^nibble:(engine_steps_total|step_model_seconds_total|step_engine_seconds_total)" \
    | sed 's/{[^}]*}//' > "$OUT/step_timers.txt"
  awk '{v[$1]=$2} END {if (v["nibble:engine_steps_total"] > 0) printf "steps %d: engine %.1f us/step, model %.2f ms/step, engine share %.2f%%\n",
    v["nibble:engine_steps_total"], 1e6*v["nibble:step_engine_seconds_total"]/v["nibble:engine_steps_total"],
    1e3*v["nibble:step_model_seconds_total"]/v["nibble:engine_steps_total"],
    100*v["nibble:step_engine_seconds_total"]/(v["nibble:step_engine_seconds_total"]+v["nibble:step_model_seconds_total"])}' \
    "$OUT/step_timers.txt"
}

configs=(${CONFIGS:-default})
summary=()
for i in "${!configs[@]}"; do
  c=${configs[$i]}
  b=$(printf '%s' "$c" | tr -d '-' | tr '=,' '_-')  # the configuration's tag in file names
  flags=()
  [ "$c" != default ] && IFS=, read -r -a flags <<< "$c"
  start_server "$OUT/serve_bench_server_$b.log" "${flags[@]}" --step-log "$OUT/steps_$b.csv"
  if [ "${FIRST:-0}" = 1 ]; then  # the server's first requests, one at a time: lazy kernel loads show here
    first=""
    for n in 16 300 1000 3000; do
      ids=$(python3 -c "import sys; n = int(sys.argv[1]); print(','.join(str(1000 + 37 * i % 90000) for i in range(n)))" "$n")
      ms=$(curl -s -o /dev/null -w '%{time_total}' localhost:8766/v1/completions -H 'Content-Type: application/json' \
        -d "{\"prompt\": [$ids], \"max_tokens\": 1}" | awk '{printf "%.1f", 1000 * $1}')
      first+="$n: $ms ms; "
    done
    summary+=("| $c | first requests (prompt tokens: ms) | $first |")
  fi
  if [ "${WORKLOAD1:-1}" = 1 ]; then
    timeout "${BENCH_TIMEOUT:-420}" build-device/nibble bench serve --port 8766 --backend openai-chat \
      --tokenizer "$SYNTH_DIR" --dataset-name random --num-prompts "${NUM_PROMPTS:-1000}" \
      --random-input-len 1136 --random-output-len 200 --random-range-ratio 0.5 --max-concurrency "${MAX_CONCURRENCY:-64}" --ignore-eos \
      --seed 0 --percentile-metrics ttft,tpot,itl,e2el,s_ttft,s_itl,s_e2el,s_decode,input_len,s_input_len,output_len \
      --metric-percentiles 50,90,99 --save-result --result-dir "$OUT" --result-filename "workload1_$b.json" \
      --disable-tqdm > "$OUT/workload1_$b.txt" 2> "$OUT/workload1_$b.err"
    echo "bench serve ($c) rc=$?"
    python3 scripts/step_log_summary.py "$OUT/steps_$b.csv"
    timers=$(step_timers)
    summary+=("$(python3 - "$OUT/workload1_$b.json" "$c" "$timers" <<'EOF'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"| {sys.argv[2]} | no result ({e}) |"); sys.exit()
print(f"| {sys.argv[2]} | {r['completed']}/{r['completed'] + r['failed']} | {r['output_throughput']:.0f} | "
      f"{r['duration']:.1f} | {r['mean_tpot_ms']:.1f} / {r['p99_tpot_ms']:.1f} | {r['median_itl_ms']:.1f} / "
      f"{r['p90_itl_ms']:.1f} / {r['p99_itl_ms']:.1f} | {r['median_ttft_ms']:.0f} / {r['p99_ttft_ms']:.0f} | {sys.argv[3]} |")
EOF
)")
  fi
  # Workload 2 (WORKLOAD2=1, on the last server): SGLang's per-token PR benchmark shape — 1,209 8-shot
  # GSM8K-like questions all in flight (with random weights every answer runs to its 512-token limit).
  if [ "${WORKLOAD2:-0}" = 1 ] && [ "$i" = $((${#configs[@]} - 1)) ]; then
    build-device/nibble eval make-gsm8k-like --out "$OUT/gsm8k.jsonl" --n 1400 --seed 1 > /dev/null
    timeout "${BENCH_TIMEOUT:-420}" build-device/nibble eval gsm8k --data "$OUT/gsm8k.jsonl" --num-shots 8 \
      --num-questions 1209 --parallel 1209 --port 8766 > "$OUT/workload2.txt" 2>&1
    echo "eval gsm8k rc=$?"; cat "$OUT/workload2.txt"
    curl -s localhost:8766/metrics | grep -E "^nibble:prefix_cache_(hits|queries)_total"
  fi
  if [ "${STRUCTURED:-0}" = 1 ] && [ "$i" = $((${#configs[@]} - 1)) ]; then
    python3 scripts/structured_smoke.py --port 8766 --n 64 --rounds "${STRUCTURED_SMOKE_ROUNDS:-1}"
    grep -iE "error|refused" "$OUT/serve_bench_server_$b.log" | head -5
    for round in $(seq "${STRUCTURED_ROUNDS:-2}"); do for kind in none json-schema; do
      curl -s -X POST localhost:8766/flush_cache > /dev/null  # each run from a cold prefix cache
      timeout "${BENCH_TIMEOUT:-420}" build-device/nibble bench serve --port 8766 --backend openai-chat \
        --tokenizer "$SYNTH_DIR" --dataset-name random --num-prompts "${STRUCTURED_PROMPTS:-512}" \
        --random-input-len 1000 --random-output-len 200 --max-concurrency 64 --ignore-eos --seed 1 \
        --structured "$kind" --disable-tqdm > "$OUT/structured_${kind}_$round.txt" 2>&1
      echo "structured $kind: $(grep -E 'Output token throughput|Successful requests|Total generated|Mean TPOT|idle between|Grammar mask' \
        "$OUT/structured_${kind}_$round.txt" | sed 's/  */ /g' | tr '\n' ';')"
    done; done
  fi
  kill -TERM $pid; wait $pid
done
grep -E "graph|KV|weights on" "$OUT"/serve_bench_server_*.log | head -5
[ "${WORKLOAD1:-1}" = 1 ] && cat "$OUT/workload1_$b.txt" && tail -3 "$OUT/workload1_$b.err"
echo "| serve flags | done | output tok/s | s | TPOT mean / p99 (ms) | ITL p50 / p90 / p99 (ms) | TTFT p50 / p99 (ms) | step timers |"
printf '%s\n' "${summary[@]}"
