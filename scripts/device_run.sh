#!/usr/bin/env bash
# One device session's work (run on the GPU machine from the repo root with build-device/ from scripts/device_bundle.sh
# and .whl/ from scripts/device_wheels.sh carried there):
# every GPU test binary, the full-size synth checkpoint timing, logs under $OUT, a short table last.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
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
rm -rf "$SYNTH_DIR"  # written anew here: its time is measured
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

# The GPU runner on real shapes: a 4-layer slice of Qwen3-30B-A3B against the CPU reference, then
# nibble bench latency on the full-size checkpoint.
SLICE_DIR=${SLICE_DIR:-/tmp/qwen3-30b-a3b-4l}
rm -rf "$SLICE_DIR"
build-device/nibble synth --preset qwen3-30b-a3b --layers 4 --out "$SLICE_DIR" --seed 1 > "$OUT/synth4.log" 2>&1
NIBBLE_TEST_MODEL="$SLICE_DIR" build-device/tests/test_cuda_runner --gtest_filter='*MatchesTheCpu*' > "$OUT/runner_4layer.log" 2>&1
results+=("$(printf '%-28s rc=%d  %s' "runner vs cpu, 4-layer slice" "$?" "$(grep -E '^mode' "$OUT/runner_4layer.log" | tr '\n' ' ')")")
if [ "${QWEN_BENCH:-1}" = 1 ]; then  # QWEN_BENCH=0 skips it (~100 s) when only other parts changed
  build-device/nibble bench latency --model "$SYNTH_DIR" --backend cuda --modes none,static,per-token \
    --pp 512,2048 --tg 128 --batches 1,16,64,128 --batch-prompt 1000 --batch-gen 32 --json "$OUT/latency.json" \
    > "$OUT/latency.log" 2>&1
  results+=("$(printf '%-28s rc=%d' "bench latency" "$?")")
fi

# ERNIE-4.5 on the GPU: the runner tests on a small ERNIE against the CPU.
ERNIE_DIR=${ERNIE_DIR:-/tmp/small-ernie}
rm -rf "$ERNIE_DIR"
build-device/nibble synth --preset small-ernie --out "$ERNIE_DIR" --seed 2 > "$OUT/synth_ernie.log" 2>&1
NIBBLE_TEST_MODEL="$ERNIE_DIR" build-device/tests/test_cuda_runner > "$OUT/runner_ernie.log" 2>&1
ernie_rc=$?
results+=("$(printf '%-28s rc=%d  %s' "runner vs cpu, small ERNIE" "$ernie_rc" "$(grep -E '^mode|FAILED  \]' "$OUT/runner_ernie.log" | tr '\n' ' ')")")
# Where it passes: the full-size synthetic ERNIE-4.5-21B-A3B, as issue 17 asks (pp2048, tg128, 64 sequences).
if [ "$ernie_rc" = 0 ]; then
  ERNIE_FULL=/tmp/ernie-4.5-21b-a3b-synth
  rm -rf "$ERNIE_FULL"
  build-device/nibble synth --preset ernie-4.5-21b-a3b --out "$ERNIE_FULL" --seed 0 > "$OUT/synth_ernie_full.log" 2>&1
  build-device/nibble bench latency --model "$ERNIE_FULL" --backend cuda --modes none \
    --pp 2048 --tg 128 --batches 64 --batch-prompt 1000 --batch-gen 32 > "$OUT/latency_ernie.log" 2>&1
  results+=("$(printf '%-28s rc=%d' "bench latency, ERNIE" "$?")")
  # Where ERNIE's prefill and decode steps spend their time, op by op (eager steps, CUDA events).
  NIBBLE_PROFILE_STEPS=1 build-device/nibble bench latency --model "$ERNIE_FULL" --backend cuda --pp 2048 --tg 16 \
    --batches "" --repeats 1 > "$OUT/profile_ernie.log" 2>&1
  rm -rf "$ERNIE_FULL"
fi

# nibble serve --backend cuda on the full-size checkpoint: a completion and a streamed chat.
build-device/nibble serve --backend cuda --model "$SYNTH_DIR" --port 8765 --max-num-seqs 64 > "$OUT/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 1 120); do curl -sf localhost:8765/health >/dev/null && break; sleep 1; done
completion=$(curl -s localhost:8765/v1/completions -H 'Content-Type: application/json' \
  -d '{"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}')
chat_events=$(curl -sN localhost:8765/v1/chat/completions -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": true, "ignore_eos": true}' | grep -c '^data:')
kill -TERM $serve_pid; wait $serve_pid
results+=("$(printf '%-28s       %s' "serve cuda: completion" "$(echo "$completion" | head -c 200)")")
results+=("$(printf '%-28s       %s' "serve cuda: chat stream" "$chat_events data events (8 tokens + role + finish/usage + DONE expected)")")


# The openai-client server tests against nibble serve --backend cuda: the machine's python has no
# openai, pytest or requests; scripts/device_wheels.sh fetches them here as wheels (carry ".whl").
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/wheels.log" 2>&1 && export PYTHONPATH=/tmp/site
fi
if python3 -c "import openai, pytest, requests" 2>/dev/null; then
  NIBBLE_BUILD_DIR="$PWD/build-device" NIBBLE_TEST_PRESET=small-moe NIBBLE_TEST_SERVE_ARGS="--backend cuda" \
    NIBBLE_TEST_SERVER_MODEL="$SYNTH_DIR" \
    python3 -m pytest -q -p no:cacheprovider tests/python/test_server_openai.py > "$OUT/pytest_server_cuda.log" 2>&1
  results+=("$(printf '%-28s rc=%d  %s' "openai tests, serve cuda" "$?" "$(tail -1 "$OUT/pytest_server_cuda.log")")")
  if [ "$ernie_rc" = 0 ]; then  # issue 17: the server tests on a small ERNIE too
    NIBBLE_BUILD_DIR="$PWD/build-device" NIBBLE_TEST_PRESET=small-moe \
      NIBBLE_TEST_SERVE_ARGS="--backend cuda" \
      python3 -m pytest -q -p no:cacheprovider tests/python/test_server_openai_ernie.py > "$OUT/pytest_server_ernie.log" 2>&1
    results+=("$(printf '%-28s rc=%d  %s' "openai tests, ERNIE cuda" "$?" "$(tail -1 "$OUT/pytest_server_ernie.log")")")
  fi
else
  results+=("$(printf '%-28s       %s' "openai tests, serve cuda" "skipped: no openai/pytest/requests (run scripts/device_wheels.sh here and carry .whl)")")
fi

grep -h "differ" "$OUT"/test_cuda_*.log > "$OUT/differ.txt"
tar -C "$OUT" -czf "$OUT/0logs.tar.gz" --exclude 0logs.tar.gz .  # every log in one file, named to sort first: the tool returns the first few files
echo "== device run ($(nproc) cores, disk: $(cat "$OUT/disk.txt")) =="
for t in "$OUT"/test_cuda_*.log; do grep -hE "Failure|Expected|actual|^mode" "$t" | head -8; done
printf '%s\n' "${results[@]}"
if [ -f "$OUT/latency.log" ]; then grep -vE "^\[nibble" "$OUT/latency.log"; fi
if [ -f "$OUT/latency_ernie.log" ]; then grep -vE "^\[nibble" "$OUT/latency_ernie.log"; fi
if [ -f "$OUT/profile_ernie.log" ]; then grep -E "steps:" "$OUT/profile_ernie.log" | sed "s/; /;\n    /g"; fi
