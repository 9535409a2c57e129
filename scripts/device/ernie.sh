# `scripts/device.sh ernie`: ERNIE-4.5-MoE on the GPU machine (build-device/ and .whl/ carried): the runner against the CPU on a small ERNIE, the openai-client server tests on it, then the
# full-size synthetic ERNIE-4.5-21B-A3B: bench latency in the three activation modes, a per-op step
# profile, and the kernels on its shapes (its MoE also with the shared experts as routed experts).
results=()
ERNIE_DIR=${ERNIE_DIR:-/tmp/small-ernie}
rm -rf "$ERNIE_DIR"
build-device/nibble synth --preset small-ernie --out "$ERNIE_DIR" --seed 2 > "$OUT/synth_ernie.log" 2>&1
NIBBLE_TEST_MODEL="$ERNIE_DIR" build-device/tests/test_cuda_runner > "$OUT/runner_ernie.log" 2>&1
results+=("$(printf '%-28s rc=%d  %s' "runner vs cpu, small ERNIE" "$?" "$(grep -E '^mode|FAILED  \]' "$OUT/runner_ernie.log" | tr '\n' ' ')")")
if test_wheels; then
  NIBBLE_BUILD_DIR="$PWD/build-device" NIBBLE_TEST_PRESET=small-moe NIBBLE_TEST_SERVE_ARGS="--backend cuda" \
    python3 -m pytest -q -p no:cacheprovider tests/python/test_server_openai_ernie.py > "$OUT/pytest_server_ernie.log" 2>&1
  results+=("$(printf '%-28s rc=%d  %s' "openai tests, ERNIE cuda" "$?" "$(tail -1 "$OUT/pytest_server_ernie.log")")")
fi

ERNIE_FULL=/tmp/ernie-4.5-21b-a3b-synth
[ -f "$ERNIE_FULL/config.json" ] ||
  build-device/nibble synth --preset ernie-4.5-21b-a3b --out "$ERNIE_FULL" --seed 0 > "$OUT/synth_ernie_full.log" 2>&1
build-device/nibble bench latency --model "$ERNIE_FULL" --backend cuda --modes "${ERNIE_MODES:-none,static,per-token}" \
  --pp 2048 --tg 128 --batches 64 --batch-prompt 1000 --batch-gen 32 --json "$OUT/latency_ernie.json" \
  > "$OUT/latency_ernie.log" 2>&1
results+=("$(printf '%-28s rc=%d' "bench latency, ERNIE" "$?")")
NIBBLE_DIAG_PROFILE_STEPS=1 build-device/nibble bench latency --model "$ERNIE_FULL" --backend cuda --pp 2048 --tg 16 \
  --batches "" --repeats 1 > "$OUT/profile_ernie.log" 2>&1
build-device/nibble bench kernels --shapes ernie-4.5-21b-a3b --m 1,16,64 --moe-tokens 1,16,64 --gemm-backend auto \
  --moe-backend auto --json "$OUT/kernels_ernie.json" > "$OUT/kernels_ernie.log" 2>&1
results+=("$(printf '%-28s rc=%d' "bench kernels, ERNIE shapes" "$?")")

echo "== ERNIE-4.5"
printf '%s\n' "${results[@]}"
grep -vE "^\[nibble" "$OUT/latency_ernie.log"
grep -E "steps:" "$OUT/profile_ernie.log" | sed "s/; /;\n    /g"
grep -E "w4a16|MoE block" "$OUT/kernels_ernie.log"
