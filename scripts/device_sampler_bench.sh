#!/usr/bin/env bash
# The GPU sampler's share of decode steps (build-device/ carried; with build-base/ from
# scripts/build_baseline.sh, its binaries alternately in the same call): the GPU tests in TESTS
# (default ops runner), then `nibble bench latency` (LATENCY: default tg128 and S_TG b1, b64) under
# each sampling configuration of SAMPLING (";"-separated: greedy, temperature 1, and Qwen3's
# suggested temperature 0.7 / top-k 20 / top-p 0.8 by default). Logs under $OUT, the table last.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
TESTS=${TESTS:-ops runner}
LATENCY=${LATENCY:---modes none --pp 1 --tg 128 --batches 1,64}
SAMPLING=${SAMPLING:---temperature 0;--temperature 1;--temperature 0.7 --top-k 20 --top-p 0.8}
synth_qwen3_full
for t in $TESTS; do timeout 300 "build-device/tests/test_cuda_$t" > "$OUT/test_$t.log" 2>&1 & done
wait
binaries=(build-device/nibble)
if [ -d build-base ]; then
  unpack_baseline
  binaries+=(build-base/nibble-*)
fi
results=()
IFS=';' read -ra configs <<< "$SAMPLING"
for c in "${configs[@]}"; do
  for b in "${binaries[@]}"; do
    tag=$(basename "$(dirname "$b")")_$(basename "$b")
    log="$OUT/latency_${tag}_$(printf '%s' "$c" | tr -c 'a-z0-9.' '_').log"
    # shellcheck disable=SC2086
    timeout 200 "$b" bench latency --model "$SYNTH_DIR" --backend cuda --batch-prompt 1000 --batch-gen 32 $LATENCY $c > "$log" 2>&1
    results+=("$(printf '%-44s %-28s rc=%d ' "$c" "$tag" "$?")$(awk '$2 ~ /^tg[0-9]/ {printf "%s=%s ", $2, $4} $2 == "S_TG" {printf "%s=%s ", $3, $5}' "$log")")
  done
done
printf '%s\n' "${results[@]}"
for t in $TESTS; do printf '%-24s %s\n' "test_cuda_$t" "$(grep -hE '^\[  (PASSED|FAILED) ' "$OUT/test_$t.log" | tr '\n' ' ')"; done
