#!/usr/bin/env bash
# Issue 16's workload 1 on the GPU machine (build-device/ carried): FastDeploy's NVFP4 MoE PR
# benchmark shape — chat requests of ShareGPT's lengths (~1136 input / ~200 output tokens, spread
# ±50%), 64 at a time, --ignore-eos — against nibble serve --backend cuda on the full-size synthetic
# Qwen3-30B-A3B, with vLLM's client-side and FastDeploy's server-side metrics. NUM_PROMPTS (1000).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
synth_qwen3_full
build-device/nibble serve --backend cuda --model "$SYNTH_DIR" --port 8766 --max-num-seqs "${MAX_NUM_SEQS:-256}" \
  > "$OUT/serve_bench_server.log" 2>&1 &
pid=$!
for _ in $(seq 1 180); do curl -sf localhost:8766/health >/dev/null && break; sleep 1; done
timeout "${BENCH_TIMEOUT:-420}" build-device/nibble bench serve --port 8766 --backend openai-chat \
  --tokenizer "$SYNTH_DIR" --dataset-name random --num-prompts "${NUM_PROMPTS:-1000}" \
  --random-input-len 1136 --random-output-len 200 --random-range-ratio 0.5 --max-concurrency 64 --ignore-eos \
  --seed 0 --percentile-metrics ttft,tpot,itl,e2el,s_ttft,s_itl,s_e2el,s_decode,input_len,s_input_len,output_len \
  --metric-percentiles 50,90,99 --save-result --result-dir "$OUT" --result-filename workload1.json --disable-tqdm \
  > "$OUT/workload1.txt" 2> "$OUT/workload1.err"
echo "bench serve rc=$?"
kill -TERM $pid; wait $pid
grep -E "graph|KV|weights on" "$OUT/serve_bench_server.log" | head -5
cat "$OUT/workload1.txt"
tail -3 "$OUT/workload1.err"
