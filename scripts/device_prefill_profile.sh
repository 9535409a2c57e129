#!/usr/bin/env bash
# Where a prefill step's GPU time goes, kernel by kernel: Nsight Compute's duration of every kernel
# of the last forward of `nibble bench latency --pp PP` (default 2048) on the full-size synthetic
# Qwen3-30B-A3B, summed by kernel name (ncu serializes launches: GPU time without launch gaps or
# PDL overlap). Run on the GPU machine with build-device/ carried; logs under $OUT, table last.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
synth_qwen3_full
PP=${PP:-2048}
timeout 400 ncu --clock-control none --csv --metrics gpu__time_duration.sum build-device/nibble bench latency \
  --model "$SYNTH_DIR" --backend cuda --pp "$PP" --tg 0 --batches "" --repeats 1 > "$OUT/ncu_prefill.csv" 2> "$OUT/ncu_prefill.err"
echo "== pp$PP, one forward (W4A16, eager, kernels serialized by ncu)"
python3 - "$OUT/ncu_prefill.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10 and r[-3] == 'gpu__time_duration.sum']
names = [r[4].replace('void ', '').replace('nibble::<unnamed>::', '').replace('nibble::cuda::', '').split('(')[0] for r in rows]
starts = [i for i, n in enumerate(names) if 'embedding_kernel' in n] or [0]
step = list(zip(names, rows))[starts[-1]:]
total = collections.defaultdict(float); count = collections.Counter()
for n, r in step: total[n] += float(r[-1].replace(',', '')) / 1e3; count[n] += 1
s = sum(total.values())
print(f'{len(step)} kernels, {s:.1f} us of GPU time')
for n, t in sorted(total.items(), key=lambda kv: -kv[1])[:25]: print(f'{n[:70]:70s} {count[n]:5d} {t:9.1f} us {100*t/s:5.1f}%')
PY
