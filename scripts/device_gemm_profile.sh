#!/usr/bin/env bash
# Profile of one GEMM kernel on the device machine (build-device/ carried): Nsight Compute's speed of
# light, scheduler and warp-state sections for KERNEL (a regex) in `nibble bench kernels ARGS`, and
# the kernel's SASS (cuobjdump) and its per-instruction stall samples (source.csv; the top ones printed
# by scripts/ncu_stalls.py), logs under $OUT.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
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
