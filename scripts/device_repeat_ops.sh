#!/usr/bin/env bash
# Where a decode step's time goes inside the CUDA graph (build-device/ carried), by difference: for each
# op in OPS, `nibble bench latency` with NIBBLE_REPEAT_OP=op (that op runs twice in every layer,
# src/cuda/step_profiler.cuh) against a run with none, on the full-size synthetic Qwen3-30B-A3B. The
# increase per layer is what the op costs in the running graph, PDL overlap included: the most that
# fusing it into a neighbour could save. MODES (default none) and BATCH (default 64) pick the runs:
# tg128 (one sequence) and S_TG at BATCH sequences of 1000-token prompts; MIXED=P adds the mixed step
# (those BATCH decode rows and a new P-token prompt: bench latency --mixed). Logs under $OUT; table last.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
synth_qwen3_full
OPS=${OPS:-qkv qk_rope_store attention o_proj post_norm router gate_up down combine}
MODES=${MODES:-none}
BATCH=${BATCH:-64}
LAYERS=48
run() {  # run NAME [VAR=VALUE]: ms per tg token, per S_TG step and per mixed step for each mode, "mode tg b x" lines
  # shellcheck disable=SC2086
  env ${2:-} timeout 150 build-device/nibble bench latency --model "$SYNTH_DIR" --backend cuda --modes "$MODES" \
    --pp 1 --tg 128 --batches "$BATCH" --batch-prompt 1000 --batch-gen 32 ${MIXED:+--mixed $MIXED} > "$OUT/repeat_$1.log" 2>&1
  awk '$2 == "tg128" {tg[$1] = $NF} $2 == "S_TG" {b[$1] = $NF} $2 == "mix" {x[$1] = $NF}
       END {for (m in tg) print m, tg[m], b[m], (m in x) ? x[m] : 0}' "$OUT/repeat_$1.log"
}
declare -A base_tg base_b base_x
while read -r m tg b x; do base_tg[$m]=$tg; base_b[$m]=$b; base_x[$m]=$x; done < <(run base)
rows=()
for op in $OPS; do
  while read -r m tg b x; do
    rows+=("$(awk -v op="$op" -v m="$m" -v tg="$tg" -v b="$b" -v x="$x" -v t0="${base_tg[$m]:-0}" -v b0="${base_b[$m]:-0}" \
      -v x0="${base_x[$m]:-0}" -v L=$LAYERS 'BEGIN {printf "%-14s %-9s tg %.3f ms (+%5.1f us/layer)   b'"$BATCH"' %.3f ms (+%5.1f us/layer)", op, m, tg, 1000*(tg-t0)/L, b, 1000*(b-b0)/L
      if (x > 0) printf "   mix %.3f ms (+%6.1f us/layer)", x, 1000*(x-x0)/L}')")
  done < <(run "$op" "NIBBLE_REPEAT_OP=$op")
done
echo "== ops run twice a layer (NIBBLE_REPEAT_OP): step time and its increase per layer =="
for m in "${!base_tg[@]}"; do
  printf '%-14s %-9s tg %.3f ms                      b%s %.3f ms                      mix %s ms\n' base "$m" "${base_tg[$m]}" \
    "$BATCH" "${base_b[$m]}" "${base_x[$m]}"
done
printf '%s\n' "${rows[@]}"
