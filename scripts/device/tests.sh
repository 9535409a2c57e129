# `scripts/device.sh tests`: correctness on the GPU. The GPU test binaries in TESTS (names after
# test_cuda_, e.g. "moe runner"; default every one bundled) and the 4-layer slice of Qwen3-30B-A3B
# against the CPU (also with YaRN in its config; and tensor-parallel against one rank), side by side; each also under the environment of every TEST_VARIANTS entry
# ("VAR=1,VAR2=x"). Then, with .whl carried, the openai-client server tests against
# `nibble serve --backend cuda` (SERVER=0 skips them; SERVER_TESTS picks the files, default
# test_server_openai.py test_server_api_compat.py test_structured_output.py; SERVE_VARIANTS adds serve
# flags) on the small synthetic model, FULL_SERVER_TESTS (files) on the full-size one, and with LOAD=1 the
# load tests (2,000 open streams, disconnects, preemption, a weight swap under traffic). TEST_TIMEOUT
# (default 300 s) bounds each test binary and slice: under a call's shorter limit, set it below that
# limit so the verdicts still print (a binary cut short names the test it was in).
synth_slice_yarn
if [ -z "${TESTS:-}" ]; then
  TESTS=$(cd build-device/tests && ls test_cuda_* 2>/dev/null | sed 's/^test_cuda_//' | tr '\n' ' ')
fi
names=()
for v in base ${TEST_VARIANTS:-}; do
  vars=""; [ "$v" != base ] && vars="${v//,/ }"
  tag=$(printf '%s' "$v" | tr '=,' '-_')
  for t in $TESTS; do
    # shellcheck disable=SC2086
    env $vars timeout "${TEST_TIMEOUT:-300}" "build-device/tests/test_cuda_$t" > "$OUT/test_${t}_$tag.log" 2>&1 &
    names+=("test_${t}_$tag")
  done
  [ -x build-device/tests/test_cuda_runner ] || continue  # the slice is test_cuda_runner's
  # shellcheck disable=SC2086
  env $vars NIBBLE_TEST_MODEL="$SLICE_DIR" timeout "${TEST_TIMEOUT:-300}" build-device/tests/test_cuda_runner --gtest_filter='*MatchesTheCpu*' \
    > "$OUT/slice_$tag.log" 2>&1 &
  names+=("slice_$tag")
  [ "$v" = base ] || continue
  if [ -x build-device/tests/test_cuda_tensor_parallel ]; then  # the split on the slice's real shapes
    NIBBLE_TEST_MODEL="$SLICE_DIR" timeout "${TEST_TIMEOUT:-300}" build-device/tests/test_cuda_tensor_parallel \
      > "$OUT/slice_tensor_parallel.log" 2>&1 &
    names+=("slice_tensor_parallel")
  fi
  NIBBLE_TEST_MODEL="$SLICE_DIR-yarn" timeout "${TEST_TIMEOUT:-300}" build-device/tests/test_cuda_runner --gtest_filter='*MatchesTheCpu*' \
    > "$OUT/slice_yarn.log" 2>&1 &
  names+=("slice_yarn")
done
wait
verdicts=()
for n in "${names[@]}"; do
  verdicts+=("$(printf '%-36s %s' "$n" "$(gtest_verdict "$OUT/$n.log")")")
  grep -hE "Failure|Expected|actual|Which is" "$OUT/$n.log" | head -4
done
grep -E "^(mode|512)" "$OUT"/slice_*.log | sed "s|$OUT/||" | head -16
if [ "${SERVER:-1}" = 1 ] || [ "${LOAD:-0}" = 1 ]; then
  if ! test_wheels; then
    verdicts+=("server tests: skipped (no openai/pytest/requests: run 'scripts/device.sh wheels' here and carry .whl)")
  else
    synth_full
    if [ "${SERVER:-1}" = 1 ]; then
      # shellcheck disable=SC2086
      # Once per SERVE_VARIANTS entry: extra `nibble serve` flags, comma-separated ("base": none;
      # e.g. "--data-parallel-size,2" runs the tests against two engines sharing the GPU).
      # A "--tp" entry serves the 4-layer slice of Qwen3-30B-A3B (small-moe's expert width does not
      # halve to the GPU kernels' multiple of 64).
      for sv in ${SERVE_VARIANTS:-base}; do
        extra=""; [ "$sv" != base ] && extra="${sv//,/ }"
        tag=$(printf '%s' "$sv" | tr -c 'a-zA-Z0-9\n' '_')
        model=""; case " $extra " in *" --tp "*) model="$SLICE_DIR" ;; esac
        # shellcheck disable=SC2086
        NIBBLE_BUILD_DIR="$PWD/build-device" NIBBLE_TEST_PRESET=small-moe NIBBLE_TEST_SERVE_ARGS="--backend cuda $extra" \
          env ${model:+NIBBLE_TEST_SERVER_MODEL=$model} timeout 400 python3 -m pytest -q -p no:cacheprovider \
          ${SERVER_TESTS:-tests/python/test_server_openai.py tests/python/test_server_api_compat.py tests/python/test_structured_output.py} \
          > "$OUT/pytest_server_cuda_$tag.log" 2>&1
        verdicts+=("$(printf '%-36s rc=%d  %s' "server tests, serve cuda $extra" "$?" "$(tail -1 "$OUT/pytest_server_cuda_$tag.log")")")
        grep -E "^(FAILED|ERROR)" "$OUT/pytest_server_cuda_$tag.log" | head -8
      done
    fi
    # Two GPUs or more: tensor parallelism over NCCL in one process (--tp 2), and over two processes
    # (--nnodes 2), on the 4-layer slice.
    gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
    if [ "$gpus" -ge 2 ] && [ "${SERVER:-1}" = 1 ]; then
      NIBBLE_BUILD_DIR="$PWD/build-device" NIBBLE_TEST_GPUS="$gpus" NIBBLE_TEST_SERVER_MODEL="$SLICE_DIR" \
        NIBBLE_TEST_SERVE_ARGS="--backend cuda --tp 2" timeout 400 python3 -m pytest -q -p no:cacheprovider \
        tests/python/test_server_openai.py tests/python/test_server_multinode.py > "$OUT/pytest_server_tp2_gpus.log" 2>&1
      verdicts+=("$(printf '%-36s rc=%d  %s' "server tests, --tp 2 over $gpus GPUs" "$?" \
        "$(tail -1 "$OUT/pytest_server_tp2_gpus.log")")")
    fi
    if [ -n "${FULL_SERVER_TESTS:-}" ]; then
      # shellcheck disable=SC2086
      NIBBLE_BUILD_DIR="$PWD/build-device" NIBBLE_TEST_PRESET=small-moe NIBBLE_TEST_SERVE_ARGS="--backend cuda" \
        NIBBLE_TEST_SERVER_MODEL="$SYNTH_DIR" timeout 400 python3 -m pytest -q -p no:cacheprovider $FULL_SERVER_TESTS \
        > "$OUT/pytest_server_full.log" 2>&1
      verdicts+=("$(printf '%-36s rc=%d  %s' "server tests, full-size cuda" "$?" "$(tail -1 "$OUT/pytest_server_full.log")")")
      grep -E "^(FAILED|ERROR)" "$OUT/pytest_server_full.log" | head -8
    fi
    if [ "${LOAD:-0}" = 1 ]; then
      # A fixed KV budget a server: several tests run a second server beside the module's, and the
      # measured sizing counts the first one's memory against the card's share.
      NIBBLE_BUILD_DIR="$PWD/build-device" NIBBLE_TEST_PRESET=small-moe NIBBLE_TEST_SERVE_ARGS="--backend cuda --kv-cache-memory-gb 2" \
        timeout 300 python3 -m pytest -q -p no:cacheprovider tests/python/test_server_load.py > "$OUT/pytest_load_cuda.log" 2>&1
      verdicts+=("$(printf '%-36s rc=%d  %s' "load tests, serve cuda" "$?" "$(tail -1 "$OUT/pytest_load_cuda.log")")")
      NIBBLE_BUILD_DIR="$PWD/build-device" NIBBLE_TEST_PRESET=small-moe NIBBLE_TEST_SERVE_ARGS="--backend cuda" \
        NIBBLE_TEST_SERVER_MODEL="$SYNTH_DIR" timeout 300 python3 -m pytest -q -s -p no:cacheprovider \
        tests/python/test_server_load.py -k "2000 or disconnect" > "$OUT/pytest_load_full.log" 2>&1
      verdicts+=("$(printf '%-36s rc=%d  %s' "2000 streams, full-size cuda" "$?" "$(tail -1 "$OUT/pytest_load_full.log")")")
    fi
  fi
fi
printf '%s\n' "${verdicts[@]}"
! printf '%s\n' "${verdicts[@]}" | grep -qE "FAILED|NOT RUN|failed|error"
