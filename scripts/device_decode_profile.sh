#!/usr/bin/env bash
# Where one decode step's GPU time goes, kernel by kernel: Nsight Compute's duration of every kernel
# of the last step of `nibble generate --enforce-eager` (single sequence) on the full-size synthetic
# Qwen3-30B-A3B, summed by kernel (launches run one at a time under ncu, so this is GPU time without
# launch gaps or PDL overlap). Then the MoE block's kernels at T = 1 and 16 from `bench kernels`.
# Run on the GPU machine with build-device/ carried; logs under $OUT, tables last.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
synth_qwen3_full
summarize() {  # CSV of ncu on stdin → per-kernel table of the last step (from the last embedding kernel)
  python3 -c "
import csv, sys, collections
rows = [r for r in csv.reader(sys.stdin) if len(r) > 10 and r[-3] == 'gpu__time_duration.sum']
names = [r[4].replace('void ', '').replace('nibble::<unnamed>::', '').split('(')[0] for r in rows]
starts = [i for i, n in enumerate(names) if '$1' in n] or [0]
step = list(zip(names, rows))[starts[-1]:]
total = collections.defaultdict(float); count = collections.Counter()
for n, r in step: total[n] += float(r[-1].replace(',', '')) / 1e3; count[n] += 1
s = sum(total.values())
print(f'{len(step)} kernels, {s:.1f} us of GPU time')
for n, t in sorted(total.items(), key=lambda kv: -kv[1]): print(f'{n[:60]:60s} {count[n]:5d} {t:9.1f} us {100*t/s:5.1f}%')
"
}
ncu --clock-control none --csv --metrics gpu__time_duration.sum build-device/nibble generate --model "$SYNTH_DIR" \
  --backend cuda --enforce-eager --prompt-ids 1,2,3 --max-tokens 3 > "$OUT/ncu_decode.csv" 2> "$OUT/ncu_decode.err"
for T in 1 16; do
  ncu --clock-control none --csv --metrics gpu__time_duration.sum --launch-count 8 build-device/nibble bench kernels \
    --ops moe --moe-tokens "$T" --moe-backend skinny --iterations 1 --batches 1 > "$OUT/ncu_moe_$T.csv" 2>&1
done
echo "== decode step, 1 sequence (W4A16, eager, kernels serialized by ncu)"
summarize embedding_kernel < "$OUT/ncu_decode.csv"
for T in 1 16; do echo "== MoE block T=$T, skinny"; summarize route_group < "$OUT/ncu_moe_$T.csv"; done
