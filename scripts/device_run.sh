#!/usr/bin/env bash
# One device session's work (run on the GPU machine from the repo root, build/ carried there):
# every GPU test binary, logs under $OUT, and a short table last.
set -uo pipefail
OUT=${OUT:-/tmp/nibble-device}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
results=()
for t in build/tests/test_cuda_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  "$t" 2>&1 | tee "$OUT/$name.log" >/dev/null
  rc=${PIPESTATUS[0]}
  summary=$(grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/$name.log" | tr '\n' ' ')
  results+=("$(printf '%-28s rc=%d  %s' "$name" "$rc" "$summary")")
done
echo "== GPU tests =="
printf '%s\n' "${results[@]}"
grep -h "differ" "$OUT"/test_cuda_*.log
