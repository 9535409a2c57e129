# `scripts/device.sh timeline`: the timeline of GPU steps, CUDA graphs included (NIBBLE_DIAG_KERNEL_TRACE: CUPTI's kernel records),
# on the full-size synthetic Qwen3-30B-A3B: each kernel's duration and exposed time in a step, gaps,
# and one layer's kernels in order (scripts/kernel_timeline.py). RUNS: `bench latency` argument sets
# separated by ";" (default: decode at 64 sequences with 1000-token contexts, single-stream decode);
# each runs once untraced (its tok/s, against the traced run's: CUPTI's own cost) and once traced.
# Bundle with BUNDLE_CUPTI=1 (`scripts/device.sh bundle`) unless the machine has libcupti.so.13.
synth_full
cupti=$(ls build-device/lib/libcupti.so.13 /usr/local/cuda/lib64/libcupti.so.13 /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13 \
  /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libcupti.so.13 2>/dev/null | head -1)
echo "CUPTI: ${cupti:-none found}"
export NIBBLE_DIAG_CUPTI_LIBRARY=${cupti:-libcupti.so.13}
RUNS=${RUNS:-"--pp '' --tg 0 --batches 64 --batch-prompt 1000 --batch-gen 16;--pp '' --tg 32 --batches ''"}
bench_runs
for i in "${!runs[@]}"; do
  bench_run_args "${runs[$i]}"
  timeout 300 build-device/nibble bench latency --model "$SYNTH_DIR" --backend cuda "${args[@]}" > "$OUT/plain_$i.log" 2>&1
  NIBBLE_DIAG_KERNEL_TRACE="$OUT/trace_$i.csv" timeout 300 build-device/nibble bench latency --model "$SYNTH_DIR" --backend cuda \
    "${args[@]}" > "$OUT/traced_$i.log" 2>&1
  echo "== bench latency ${runs[$i]} (rc $?): untraced, then traced"
  grep -E "^(none|static|per-token) " "$OUT/plain_$i.log"
  grep -E "^(none|static|per-token) " "$OUT/traced_$i.log"
  grep -E "kernel trace|NIBBLE_DIAG_KERNEL_TRACE|CUPTI" "$OUT/traced_$i.log"
  python3 scripts/kernel_timeline.py "$OUT/trace_$i.csv" > "$OUT/timeline_$i.md" 2>&1
  cat "$OUT/timeline_$i.md"
  gzip -f "$OUT/trace_$i.csv"
done
