# `scripts/device.sh latency`: `nibble bench latency $LATENCY` (default: W4A16 pp512, pp2048, tg128,
# 64 sequences) on the full-size synthetic Qwen3-30B-A3B, alone on the GPU, once per VARIANTS entry
# ("base", or "VAR=1,VAR2=x" settings, or "--flag,value" serve flags). BASELINE=1 (build-base/
# carried: `scripts/device.sh baseline COMMIT…` here) runs this build and each baseline alternately,
# ROUNDS (default 2) times each: machines differ by several percent on one binary, so a comparison
# needs all in one call. KERNELS (bench kernels arguments) adds those rows per variant. The runs side
# by side last (scripts/latency_compare.py), each against the first.
LATENCY=${LATENCY:---modes none --pp 512,2048 --tg 128 --batches 64}
eval "latency=($LATENCY)"  # shell words, so an empty list can be given as '' (--pp '')
synth_full
results=()
compare_args=()
# run_latency TAG BIN [VARIANT]: a variant's comma-separated items are NAME=VALUE settings for its
# environment or flags and their values for `bench latency` ("--moe-backend,skinny").
run_latency() {
  local tag=$1 bin=$2 vars flags items=()
  [ -n "${3:-}" ] && [ "$3" != base ] && IFS=, read -r -a items <<< "$3"
  split_settings "${items[@]}"
  env "${vars[@]}" timeout 300 "$bin" bench latency --model "$SYNTH_DIR" --backend cuda --batch-prompt 1000 --batch-gen 32 \
    "${latency[@]}" "${flags[@]}" > "$OUT/latency_$tag.log" 2>&1
  results+=("$(printf '%-36s rc=%d  %s' "latency $tag" "$?" "$(latency_summary "$OUT/latency_$tag.log")")")
  compare_args+=(--name "$tag" "$OUT/latency_$tag.log")
}
if [ "${BASELINE:-0}" = 1 ]; then
  unpack_baseline
  for r in $(seq "${ROUNDS:-2}"); do
    for b in build-device/nibble build-base/nibble-*; do
      run_latency "$(basename "$(dirname "$b")")_$(basename "$b")_$r" "$b"
    done
  done
fi
default_variants=base; [ "${BASELINE:-0}" = 1 ] && default_variants=""
for v in ${VARIANTS-$default_variants}; do
  tag=$(printf '%s' "$v" | tr -d '-' | tr '=,' '-_')
  run_latency "$tag" build-device/nibble "$v"
  if [ -n "${KERNELS:-}" ]; then
    vars=(); [[ $v == *=* ]] && IFS=, read -r -a vars <<< "$v"
    # shellcheck disable=SC2086
    env "${vars[@]}" timeout 200 build-device/nibble bench kernels $KERNELS > "$OUT/kernels_$tag.log" 2>&1
    results+=("$(printf 'kernels %s rc=%d\n' "$v" "$?")$(awk '$2 ~ /^[0-9]+$/' "$OUT/kernels_$tag.log")")
  fi
done
printf '%s\n' "${results[@]}"
[ "${#compare_args[@]}" -gt 3 ] && python3 scripts/latency_compare.py "${compare_args[@]}"
true
