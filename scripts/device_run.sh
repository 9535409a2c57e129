#!/usr/bin/env bash
# One device session's work (run on the GPU machine from the repo root, build-device/ from scripts/device_bundle.sh carried there):
# every GPU test binary, the full-size synth checkpoint timing, logs under $OUT, a short table last.
set -uo pipefail
OUT=${OUT:-/tmp/nibble-device}
mkdir -p "$OUT"
export NIBBLE_DATA_DIR="$PWD/data"
export LD_LIBRARY_PATH="$PWD/build-device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
results=()
for t in build-device/tests/test_cuda_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  "$t" > "$OUT/$name.log" 2>&1
  rc=$?
  summary=$(grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/$name.log" | tr '\n' ' ')
  results+=("$(printf '%-28s rc=%d  %s' "$name" "$rc" "$summary")")
done

# Full-size Qwen3-30B-A3B synthetic checkpoint: write speed and a clean inspect.
SYNTH_DIR=${SYNTH_DIR:-/tmp/qwen3-30b-a3b-synth}
rm -rf "$SYNTH_DIR"
df -h "$(dirname "$SYNTH_DIR")" | tail -1 > "$OUT/disk.txt"
# The disk's own sequential write speed, for comparison (8 GB, synced).
dd if=/dev/zero of="$SYNTH_DIR.dd" bs=16M count=512 conv=fdatasync 2>&1 | tail -1 > "$OUT/dd.txt"
rm -f "$SYNTH_DIR.dd"
build-device/nibble synth --preset qwen3-30b-a3b --out "$SYNTH_DIR" --seed 0 > "$OUT/synth.log" 2>&1
synth_rc=$?
build-device/nibble inspect "$SYNTH_DIR" > "$OUT/inspect.log" 2>&1
inspect_rc=$?
results+=("$(printf '%-28s rc=%d  %s' "synth qwen3-30b-a3b" "$synth_rc" "$(grep '^wrote' "$OUT/synth.log")")")
results+=("$(printf '%-28s       %s' "disk (dd, 8 GB)" "$(cat "$OUT/dd.txt")")")
results+=("$(printf '%-28s rc=%d  %s' "inspect qwen3-30b-a3b" "$inspect_rc" "$(grep -E '^(problems|per token)' "$OUT/inspect.log" | tr '\n' ' ')")")

echo "== device run ($(nproc) cores, disk: $(cat "$OUT/disk.txt")) =="
printf '%s\n' "${results[@]}"
grep -h "differ" "$OUT"/test_cuda_*.log
