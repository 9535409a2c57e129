# `scripts/device.sh profile`: where GPU time goes, by WHAT (default kernel):
#   kernel   Nsight Compute's speed of light, scheduler, warp-state and memory sections for KERNEL (a
#            regex; default nvfp4_wgmma) in `nibble bench kernels ARGS`, its SASS and per-instruction
#            stall samples (scripts/ncu_stalls.py)
#   metrics  key counters (time, DRAM, issue, pipes, stalls) of PROFILE_KERNEL in `bench kernels
#            PROFILE_ARGS`, this build's and with BASELINE=1 build-base/'s
#   prefill  every kernel of one `bench latency --pp PP` forward (default 2048) summed by name (ncu
#            serializes launches: GPU time without gaps or PDL overlap); BIN, KERNEL (+ LAST launches
#            a forward), MODE; METRICS=N reads the key counters of KERNEL's first N launches instead
#   decode   every kernel of the last step of a single-sequence eager decode, then the MoE block's at
#            T = 1 and 16
#   moe      GPU time and warp instructions of each kernel of one MoE forward at each of TOKENS
#   steps    the step profiler (NIBBLE_DIAG_PROFILE_STEPS=1: eager steps timed op by op) over RUNS,
#            `bench latency` argument sets separated by ";"; MODES where a set names none
#   repeat   each op of OPS run twice a layer (NIBBLE_DIAG_REPEAT_OP) against none: its cost inside the
#            decode graph, PDL overlap included; MODES, BATCH (64), MIXED=P
# On the full-size synthetic Qwen3-30B-A3B (written once per machine).
synth_full
case "${WHAT:-kernel}" in
kernel)
KERNEL=${KERNEL:-nvfp4_wgmma}
ARGS=${ARGS:---ops dense --m 8192 --gemm-backend wgmma}
ncu --clock-control none --kernel-name "regex:$KERNEL" --launch-count 1 --section SpeedOfLight --section SchedulerStats \
  --section WarpStateStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
  --section ComputeWorkloadAnalysis --section SourceCounters --metrics smsp__inst_executed_pipe_tensor_op_gmma.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active \
  --import-source no -o "$OUT/profile" build-device/nibble bench kernels $ARGS --iterations 1 --batches 1 > "$OUT/ncu_run.txt" 2>&1
ncu -i "$OUT/profile.ncu-rep" --print-details all > "$OUT/ncu.txt" 2>&1
# Per-SASS-instruction counters (warp stall samples by reason, executed instructions) of the kernel.
ncu -i "$OUT/profile.ncu-rep" --page source --csv --print-source sass > "$OUT/source.csv" 2>&1
cuobjdump -sass build-device/nibble > "$OUT/all.sass" 2>&1
python3 - "$OUT/all.sass" "$KERNEL" > "$OUT/kernel.sass" <<'PY'
import sys, re
text = open(sys.argv[1]).read().split("\n")
out, on = [], False
for line in text:
    if "Function :" in line: on = sys.argv[2] in line
    if on: out.append(line)
print("\n".join(out))
PY
gzip -k "$OUT/all.sass" && rm "$OUT/all.sass"
grep -cE "HGMMA" "$OUT/kernel.sass" | sed 's/^/HGMMA instructions: /'
sed -n '/Section: GPU Speed Of Light/,$p' "$OUT/ncu.txt" | grep -vE "^ *-+ *$|^ *$|OPT|Section:|Metric Name" | head -90
python3 scripts/ncu_stalls.py "$OUT/source.csv" 30 | cut -c1-200
;;
metrics)
PROFILE_KERNEL=${PROFILE_KERNEL:-skinny_moe_}
PROFILE_ARGS=${PROFILE_ARGS:---ops moe --moe-tokens 64 --moe-backend skinny}
# shellcheck disable=SC2086
echo "this build: $(key_metrics "$OUT/profile_this.csv" build-device/nibble $PROFILE_ARGS)"
if [ "${BASELINE:-0}" = 1 ]; then
  unpack_baseline
  # shellcheck disable=SC2086
  echo "baseline:   $(key_metrics "$OUT/profile_base.csv" build-base/nibble $PROFILE_ARGS)"
fi
;;
prefill)
PP=${PP:-2048}
BIN=${BIN:-build-device/nibble}
KERNEL=${KERNEL:-.}
MODE=${MODE:-none}
tag=$(basename "$BIN")_$MODE
bench=("$BIN" bench latency --model "$SYNTH_DIR" --backend cuda --modes "$MODE" --pp "$PP" --tg 0 --batches "" --repeats 1)
if [ -n "${METRICS:-}" ]; then
  timeout 400 ncu --clock-control none --csv --kernel-name "regex:$KERNEL" --launch-count "$METRICS" \
    --metrics "$KEY_METRICS,dram__bytes_read.sum,dram__bytes_write.sum,launch__registers_per_thread,launch__grid_size" \
    "${bench[@]}" > "$OUT/ncu_metrics_$tag.csv" 2> "$OUT/ncu_metrics_$tag.err"
  echo "== $BIN ($MODE): pp$PP, key counters of the first $METRICS launches of $KERNEL (averaged per kernel; MB, us)"
  python3 -c "
import csv, re, sys, collections
short = {'gpu__time_duration': 'us', 'dram__throughput': 'dram%', 'dram__bytes_read': 'rdMB', 'dram__bytes_write': 'wrMB',
         'lts__t_sector_hit_rate': 'l2hit%', 'smsp__issue_active': 'issue%', 'sm__warps_active': 'warps%',
         'launch__registers_per_thread': 'regs', 'launch__grid_size': 'grid', 'smsp__inst_executed': 'inst'}
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 12 and r[-3] != 'Metric Name']
sums = collections.defaultdict(lambda: collections.defaultdict(float)); launches = collections.defaultdict(set)
for r in rows:
    m = re.search(r'(\w+_kernel)(<[^>]*>)?', r[4])
    name = (m.group(1) + (m.group(2) or '')).replace(' ', '') if m else r[4][:40]
    metric = r[-3].split('.')[0]
    if metric not in short and 'stalled' not in metric: continue
    value = float(r[-1].replace(',', '') or 0)
    unit = r[-2]
    if metric == 'gpu__time_duration': value /= 1000 if unit == 'nsecond' else 1
    if metric.startswith('dram__bytes'): value /= {'byte': 1e6, 'Kbyte': 1e3, 'Mbyte': 1, 'Gbyte': 1e-3}.get(unit, 1e6)
    label = short.get(metric, metric.replace('smsp__average_warps_issue_stalled_', '').replace('_per_issue_active', ''))
    sums[name][label] += value; launches[name].add(r[0])
for name, s in sums.items():
    n = len(launches[name])
    print(f'{name[:60]} x{n}: ' + ' '.join(f'{k}={v / n:.1f}' for k, v in s.items()))
" "$OUT/ncu_metrics_$tag.csv"
else
timeout 400 ncu --clock-control none --csv --kernel-name "regex:$KERNEL" --metrics gpu__time_duration.sum "${bench[@]}" \
  > "$OUT/ncu_prefill_$tag.csv" 2> "$OUT/ncu_prefill_$tag.err"
echo "== $BIN: pp$PP, one forward (mode $MODE, eager, kernels serialized by ncu)"
# The last forward: from its embedding, or the last LAST launches of the kernels timed.
start=embedding_kernel; [ "$KERNEL" != . ] && start=${LAST:?LAST: the launches of KERNEL in one forward}
ncu_kernel_table "$start" < "$OUT/ncu_prefill_$tag.csv" | head -34
fi
;;
decode)
ncu --clock-control none --csv --metrics gpu__time_duration.sum build-device/nibble generate --model "$SYNTH_DIR" \
  --backend cuda --enforce-eager --prompt-ids 1,2,3 --max-tokens 3 > "$OUT/ncu_decode.csv" 2> "$OUT/ncu_decode.err"
for T in 1 16; do
  ncu --clock-control none --csv --metrics gpu__time_duration.sum --launch-count 8 build-device/nibble bench kernels \
    --ops moe --moe-tokens "$T" --moe-backend skinny --iterations 1 --batches 1 > "$OUT/ncu_moe_$T.csv" 2>&1
done
echo "== decode step, 1 sequence (W4A16, eager, kernels serialized by ncu)"
ncu_kernel_table embedding_kernel < "$OUT/ncu_decode.csv"
for T in 1 16; do echo "== MoE block T=$T, skinny"; ncu_kernel_table route_group < "$OUT/ncu_moe_$T.csv"; done
;;
moe)
TOKENS=${TOKENS:-1 128 8192}
for T in $TOKENS; do
  # The first forward of `bench kernels --ops moe` is router GEMM, top-k, grouping, gate_up, down, combine.
  ncu --clock-control none --csv --metrics gpu__time_duration.sum,smsp__inst_executed.sum --launch-count 6 \
    build-device/nibble bench kernels --ops moe --moe-tokens "$T" --iterations 1 --batches 1 > "$OUT/ncu_times_$T.csv" 2>&1
  ncu --clock-control none --kernel-name regex:moe_gemm --launch-count 2 --section SpeedOfLight \
    --section SchedulerStats --section WarpStateStats --section Occupancy \
    build-device/nibble bench kernels --ops moe --moe-tokens "$T" --iterations 1 --batches 1 > "$OUT/ncu_gemm_$T.txt" 2>&1
done
for T in $TOKENS; do
  echo "== T=$T: kernel, grid, time (ns) / warp instructions"
  grep -E "gpu__time|inst_exec" "$OUT/ncu_times_$T.csv" | python3 -c "
import csv, sys
for r in csv.reader(sys.stdin): print(r[4][:40].ljust(40), r[8].ljust(14), r[-3][:22].ljust(24), r[-1])"
  grep -E "Duration|Compute \(SM\) Throughput|DRAM Throughput|Issued Warp Per Scheduler|Achieved Active Warps" "$OUT/ncu_gemm_$T.txt"
done
;;
steps)
RUNS=${RUNS:-"--pp 2048 --tg 64 --batches '' --repeats 5;--pp '' --tg 0 --batches 64 --batch-prompt 1000 --batch-gen 16"}
bench_runs
for i in "${!runs[@]}"; do
  log="$OUT/profile_$i.log"
  bench_run_args "${runs[$i]}"
  NIBBLE_DIAG_PROFILE_STEPS=1 timeout 300 build-device/nibble bench latency --model "$SYNTH_DIR" --backend cuda \
    "${args[@]}" > "$log" 2>&1
  echo "== bench latency ${runs[$i]} (rc $?)"
  grep -vE "^\[nibble info\] (weights|GPU KV|CPU KV)" "$log" | sed 's/; /;\n    /g'
done
;;
repeat)
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
  done < <(run "$op" "NIBBLE_DIAG_REPEAT_OP=$op")
done
echo "== ops run twice a layer (NIBBLE_DIAG_REPEAT_OP): step time and its increase per layer =="
for m in "${!base_tg[@]}"; do
  printf '%-14s %-9s tg %.3f ms                      b%s %.3f ms                      mix %s ms\n' base "$m" "${base_tg[$m]}" \
    "$BATCH" "${base_b[$m]}" "${base_x[$m]}"
done
printf '%s\n' "${rows[@]}"
;;
*) echo "profile: WHAT must be kernel, metrics, prefill, decode, moe, steps or repeat (got '$WHAT')" >&2; false ;;
esac
