#!/usr/bin/env bash
# One device call comparing this build with a baseline build in the same run: build-device/ (this
# tree, scripts/device_bundle.sh) and build-base/ (BASE_DIR; the baseline commit's stripped nibble,
# alone or gzipped as bins.tar.gz: scripts/build_baseline.sh COMMIT).
# PARTS (default tests,slice,kernels,latency): every GPU test of this build, the 4-layer slice
# against the CPU, `nibble bench kernels` rows (MOE_ROWS, DENSE_ROWS), `nibble bench latency`
# (LATENCY flags) of both builds on the full-size synthetic Qwen3-30B-A3B, and with "profile" Nsight
# Compute's key counters for PROFILE_KERNEL in `bench kernels PROFILE_ARGS`. VARIANTS (environment
# settings, e.g. "base NIBBLE_SKINNY_BLOCKS=2") repeat this build's kernel rows under each, and
# LATENCY_VARIANTS (extra flags or NAME=VALUE settings, commas for spaces, e.g. "--moe-backend,skinny"
# or "NIBBLE_WGMMA_N=64") its latency run. Logs under $OUT; table last.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
BASE_DIR=${BASE_DIR:-build-base}
PARTS=${PARTS:-tests,slice,kernels,latency}
# "backend:tokens" groups of `bench kernels --ops moe` and "backend:M" of `--ops dense`.
MOE_ROWS=${MOE_ROWS:-all:1,16,64,128,256,512,2048,8192}
DENSE_ROWS=${DENSE_ROWS:-all:1,16,32,64,8192}
LATENCY=${LATENCY:---modes none --pp 2048 --tg 128 --batches 16,64,128,256}
PROFILE_KERNEL=${PROFILE_KERNEL:-skinny_moe_}  # the split and long-warp MoE kernels
PROFILE_ARGS=${PROFILE_ARGS:---ops moe --moe-tokens 64 --moe-backend skinny}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
if [ -f "$BASE_DIR/bins.tar.gz" ] && [ ! -x "$BASE_DIR/nibble" ]; then tar -C "$BASE_DIR" -xzf "$BASE_DIR/bins.tar.gz"; fi
results=()
if has tests; then
  for t in build-device/tests/test_cuda_*; do
    name=$(basename "$t")
    timeout 240 "$t" > "$OUT/$name.log" 2>&1
    results+=("$(printf '%-30s rc=%d  %s' "$name" "$?" "$(grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/$name.log" | tr '\n' ' ')")")
  done
fi
if has slice; then
  SLICE_DIR=/tmp/qwen3-30b-a3b-4l
  [ -f "$SLICE_DIR/config.json" ] || build-device/nibble synth --preset qwen3-30b-a3b --layers 4 --out "$SLICE_DIR" --seed 1 \
    > "$OUT/synth4.log" 2>&1
  NIBBLE_TEST_MODEL="$SLICE_DIR" timeout 240 build-device/tests/test_cuda_runner --gtest_filter='*MatchesTheCpu*' \
    > "$OUT/runner_4layer.log" 2>&1
  results+=("$(printf '%-30s rc=%d  %s' "runner vs cpu, 4-layer slice" "$?" "$(grep -E '^\[  (PASSED|FAILED) ' "$OUT/runner_4layer.log" | tr '\n' ' ')")")
fi
# kernel_rows LABEL BIN [ENV...]: the MOE_ROWS and DENSE_ROWS groups of `bench kernels` under ENV.
kernel_rows() {
  local label=$1 bin=$2 ops rows flag group; shift 2
  local log="$OUT/kernels_$(printf '%s' "$label" | tr '=,' '-_').txt"
  for ops in moe dense; do
    rows=$MOE_ROWS; flag=--moe-tokens; [ $ops = dense ] && rows=$DENSE_ROWS && flag=--m
    for group in $rows; do
      env "$@" timeout 150 "$bin" bench kernels --ops $ops $flag "${group#*:}" --gemm-backend "${group%%:*}" \
        --moe-backend "${group%%:*}" >> "$log" 2>&1
    done
  done
  results+=("$(printf '%-8s kernels: %s' "$label" "$(awk '$3 ~ /\/w4a16$/ {printf "%s:%s:%s=%s ", $1, $2, $3, $4}' "$log")")")
}
# latency_run LABEL BIN [ARGS...]: `bench latency` with LATENCY and ARGS, where NAME=VALUE arguments
# are set in its environment and the rest are flags.
latency_run() {
  local label=$1 bin=$2 arg; shift 2
  local log="$OUT/latency_$(printf '%s' "$label" | tr -d '-' | tr ',=' '__').log" vars=() flags=()
  for arg in "$@"; do if [[ $arg =~ ^[A-Z_][A-Z0-9_]*= ]]; then vars+=("$arg"); else flags+=("$arg"); fi; done
  # shellcheck disable=SC2086
  env "${vars[@]}" timeout 240 "$bin" bench latency --model "$SYNTH_DIR" --backend cuda --batch-prompt 1000 --batch-gen 32 \
    $LATENCY "${flags[@]}" > "$log" 2>&1
  results+=("$(printf '%-8s latency rc=%d  %s' "$label" "$?" "$(awk '$2 ~ /^(pp|tg)[0-9]/ {printf "%s/%s=%s ", $1, $2, $4} $2 == "S_TG" {printf "%s/%s=%s ", $1, $3, $5}' "$log")")")
}
for build in base new; do
  bin=build-device/nibble; [ $build = base ] && bin=$BASE_DIR/nibble
  [ -x "$bin" ] || { results+=("$build: no $bin"); continue; }
  if has kernels; then
    kernel_rows $build "$bin"
    if [ $build = new ]; then
      for v in ${VARIANTS:-}; do [ "$v" = base ] || kernel_rows "$v" "$bin" ${v//,/ }; done
    fi
  fi
  if has profile; then
    # shellcheck disable=SC2086
    results+=("$(printf '%-8s profile %s' "$build" "$(key_metrics "$OUT/profile_$build.csv" "$bin" $PROFILE_ARGS)")")
  fi
  if has latency && { [ $build = new ] || [ "${BASE_LATENCY:-1}" = 1 ]; }; then  # BASE_LATENCY=0: this build's only
    synth_qwen3_full
    latency_run $build "$bin"
    if [ $build = new ]; then
      for v in ${LATENCY_VARIANTS:-}; do latency_run "$v" "$bin" ${v//,/ }; done
    fi
  fi
done
for t in "$OUT"/test_cuda_*.log "$OUT"/runner_4layer.log; do [ -f "$t" ] && grep -hE "Failure|Expected|actual|Which is" "$t" | head -6; done
printf '%s\n' "${results[@]}"
