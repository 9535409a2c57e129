#!/usr/bin/env bash
# Per-kernel profile of one MoE forward (fused backend, W4A16) on the device machine (build-device/
# carried): Nsight Compute's GPU time and executed warp instructions for each kernel at each T, at
# the GPU's own clocks; then the stall breakdown of the grouped GEMMs. Logs under $OUT, tables last.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
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
