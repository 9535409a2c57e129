#!/usr/bin/env bash
# Where a prefill step's GPU time goes, kernel by kernel: Nsight Compute's duration of every kernel
# of the last forward of `nibble bench latency --pp PP` (default 2048) on the full-size synthetic
# Qwen3-30B-A3B, summed by kernel name (ncu serializes launches: GPU time without launch gaps or
# PDL overlap). BIN picks the binary (default build-device/nibble); KERNEL, a regex, times only those
# kernels, LAST of them per forward. METRICS=N instead reads the key counters (DRAM bytes and
# throughput, occupancy, stalls) of the first N launches of KERNEL, averaged per kernel. MODE picks the
# activation numerics (none, static or per-token; default none). Run on the
# GPU machine with build-device/ carried; logs under $OUT, table last.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
synth_qwen3_full
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
  exit 0
fi
timeout 400 ncu --clock-control none --csv --kernel-name "regex:$KERNEL" --metrics gpu__time_duration.sum "${bench[@]}" \
  > "$OUT/ncu_prefill_$tag.csv" 2> "$OUT/ncu_prefill_$tag.err"
echo "== $BIN: pp$PP, one forward (mode $MODE, eager, kernels serialized by ncu)"
# The last forward: from its embedding, or the last LAST launches of the kernels timed.
start=embedding_kernel; [ "$KERNEL" != . ] && start=${LAST:?LAST: the launches of KERNEL in one forward}
ncu_kernel_table "$start" < "$OUT/ncu_prefill_$tag.csv" | head -34
