#!/usr/bin/env bash
# Profile of one GEMM kernel on the device machine (build-device/ carried): Nsight Compute's speed of
# light, scheduler and warp-state sections for KERNEL (a regex) in `nibble bench kernels ARGS`, and
# the kernel's SASS (cuobjdump), logs under $OUT.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
KERNEL=${KERNEL:-nvfp4_wgmma}
ARGS=${ARGS:---ops dense --m 8192 --gemm-backend wgmma}
ncu --clock-control none --kernel-name "regex:$KERNEL" --launch-count 1 --section SpeedOfLight --section SchedulerStats \
  --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  build-device/nibble bench kernels $ARGS --iterations 1 --batches 1 > "$OUT/ncu.txt" 2>&1
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
grep -E "Duration|Throughput|Issued Warp|No Eligible|Active Warps|Warp Cycles|Stall|Bank|L1/TEX Hit|L2 Hit|Pipe" "$OUT/ncu.txt" | head -60
