#!/usr/bin/env bash
# A short device call (build-device/ carried) for a change's correctness and speed at once: the GPU
# test binaries in TESTS (default all) and the 4-layer slice against the CPU run side by side (they
# check results, not time), each also under the environment of every non-base VARIANTS entry listed
# in TEST_VARIANTS; then `nibble bench latency $LATENCY` on the full-size synthetic Qwen3-30B-A3B
# once per VARIANTS entry ("base" or "VAR=1,VAR2=x"), alone on the GPU, and `nibble bench kernels
# $KERNELS` too when KERNELS is set. BASELINE=1 (build-base/ carried, scripts/build_baseline.sh with
# one or more commits) runs the latency of this build and of each baseline alternately, ROUNDS (default
# 2) times each: machines differ by several percent on one binary, so a comparison needs all in one
# call (bundle with BUNDLE_TESTS="$TESTS" so that build-device/ and build-base/ fit the carry
# limit). Logs under $OUT, table last, the tests' verdicts at its end.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
TESTS=${TESTS:-router moe ops runner linear quantize}
LATENCY=${LATENCY:---modes none --pp 512,2048 --tg 128 --batches 64}
eval "latency=($LATENCY)"  # shell words, so an empty list can be given as '' (--pp '')
synth_qwen3_full &
SLICE_DIR=/tmp/qwen3-30b-a3b-4l
[ -f "$SLICE_DIR/config.json" ] ||
  build-device/nibble synth --preset qwen3-30b-a3b --layers 4 --out "$SLICE_DIR" --seed 1 > "$OUT/synth4.log" 2>&1
names=()
for v in base ${TEST_VARIANTS:-}; do
  vars=""; [ "$v" != base ] && vars="${v//,/ }"
  tag=$(printf '%s' "$v" | tr '=,' '-_')
  for t in $TESTS; do
    env $vars timeout 200 "build-device/tests/test_cuda_$t" > "$OUT/test_${t}_$tag.log" 2>&1 &
    names+=("test_${t}_$tag")
  done
  env $vars NIBBLE_TEST_MODEL="$SLICE_DIR" timeout 200 build-device/tests/test_cuda_runner --gtest_filter='*MatchesTheCpu*' \
    > "$OUT/slice_$tag.log" 2>&1 &
  names+=("slice_$tag")
done
wait
verdicts=()
for n in "${names[@]}"; do
  # No PASSED/FAILED line: the binary crashed, timed out or was not bundled (BUNDLE_TESTS; the slice
  # is test_cuda_runner's).
  verdict=$(grep -hE "^\[  (PASSED|FAILED) " "$OUT/$n.log" | tr '\n' ' ')
  verdicts+=("$(printf '%-36s %s' "$n" "${verdict:-NOT RUN TO THE END: $(tail -1 "$OUT/$n.log")}")")
  grep -hE "Failure|Expected|actual|Which is" "$OUT/$n.log" | head -4
done
results=()
compare_args=()  # the latency logs side by side (scripts/latency_compare.py): --name N LOG … a variant
latency_summary() {
  awk '$2 ~ /^(pp|tg)[0-9]/ {printf "%s/%s=%s ", $1, $2, $4} $2 == "S_TG" {printf "%s/%s=%s ", $1, $3, $5}
       $2 == "mix" {printf "%s/%s=%sms ", $1, $3, $6}' "$1"
}
if [ "${BASELINE:-0}" = 1 ]; then
  unpack_baseline
  for r in $(seq "${ROUNDS:-2}"); do
    for b in build-device/nibble build-base/nibble-*; do
      tag=$(basename "$(dirname "$b")")_$(basename "$b")_$r
      timeout 200 "$b" bench latency --model "$SYNTH_DIR" --backend cuda --batch-prompt 1000 --batch-gen 32 "${latency[@]}" \
        > "$OUT/latency_$tag.log" 2>&1
      results+=("$(printf '%-36s rc=%d  %s' "latency $tag" "$?" "$(latency_summary "$OUT/latency_$tag.log")")")
      compare_args+=(--name "$tag" "$OUT/latency_$tag.log")
    done
  done
fi
default_variants=base; [ "${BASELINE:-0}" = 1 ] && default_variants=""
for v in ${VARIANTS-$default_variants}; do
  vars=""; [ "$v" != base ] && vars="${v//,/ }"
  tag=$(printf '%s' "$v" | tr '=,' '-_')
  # shellcheck disable=SC2086
  env $vars timeout 200 build-device/nibble bench latency --model "$SYNTH_DIR" --backend cuda --batch-prompt 1000 \
    --batch-gen 32 "${latency[@]}" > "$OUT/latency_$tag.log" 2>&1
  results+=("$(printf '%-36s rc=%d  %s' "latency $v" "$?" "$(latency_summary "$OUT/latency_$tag.log")")")
  compare_args+=(--name "$v" "$OUT/latency_$tag.log")
  if [ -n "${KERNELS:-}" ]; then
    # shellcheck disable=SC2086
    env $vars timeout 200 build-device/nibble bench kernels $KERNELS > "$OUT/kernels_$tag.log" 2>&1
    results+=("$(printf 'kernels %s rc=%d\n' "$v" "$?")$(awk '$2 ~ /^[0-9]+$/' "$OUT/kernels_$tag.log")")
  fi
done
grep -hE "^(mode|512)" "$OUT"/slice_*.log | head -8
printf '%s\n' "${results[@]}"
# The variants side by side, each against the first (two or more).
[ "${#compare_args[@]}" -gt 3 ] && python3 scripts/latency_compare.py "${compare_args[@]}"
# The verdicts last: the call returns only the output's tail, and the kernel tables are long.
printf '%s\n' "${verdicts[@]}"
