#!/usr/bin/env bash
# One device session's work (run on the GPU machine from the repo root with build-device/ from scripts/device_bundle.sh
# and .whl/ from scripts/device_wheels.sh carried there):
# every GPU test binary, the full-size synth checkpoint timing, logs under $OUT, a short table last.
# PARTS (default all: tests,synth,slice,latency,serve,openai,load,ernie) picks parts, so the work
# can be split over calls of the tool's 10-minute limit; every step has its own timeout.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
PARTS=${PARTS:-tests,synth,slice,latency,serve,openai,load,ernie}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
echo "(not measured)" > "$OUT/disk.txt"
results=()
if has tests; then
for t in build-device/tests/test_cuda_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  timeout 240 "$t" > "$OUT/$name.log" 2>&1
  rc=$?
  summary=$(grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/$name.log" | tr '\n' ' ')
  results+=("$(printf '%-28s rc=%d  %s' "$name" "$rc" "$summary")")
done
fi

# Full-size Qwen3-30B-A3B synthetic checkpoint: write speed and a clean inspect (parts after it
# write it when missing, without the timing).
if has synth; then
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
fi

if has latency || has serve || has openai || has load; then synth_qwen3_full; fi

# The GPU runner on real shapes: a 4-layer slice of Qwen3-30B-A3B against the CPU reference.
if has slice; then
  SLICE_DIR=${SLICE_DIR:-/tmp/qwen3-30b-a3b-4l}
  rm -rf "$SLICE_DIR"
  build-device/nibble synth --preset qwen3-30b-a3b --layers 4 --out "$SLICE_DIR" --seed 1 > "$OUT/synth4.log" 2>&1
  NIBBLE_TEST_MODEL="$SLICE_DIR" timeout 240 build-device/tests/test_cuda_runner --gtest_filter='*MatchesTheCpu*' \
    > "$OUT/runner_4layer.log" 2>&1
  results+=("$(printf '%-28s rc=%d  %s' "runner vs cpu, 4-layer slice" "$?" "$(grep -E '^(mode|512)' "$OUT/runner_4layer.log" | tr '\n' ' ')")")
fi
# nibble bench latency on the full-size checkpoint (~100 s).
if has latency; then
  timeout 300 build-device/nibble bench latency --model "$SYNTH_DIR" --backend cuda --modes none,static,per-token \
    --pp 512,2048 --tg 128 --batches 1,16,64,128,256 --batch-prompt 1000 --batch-gen 32 --json "$OUT/latency.json" \
    > "$OUT/latency.log" 2>&1
  results+=("$(printf '%-28s rc=%d' "bench latency" "$?")")
fi

# nibble serve --backend cuda on the full-size checkpoint: a completion and a streamed chat.
if has serve; then
  build-device/nibble serve --backend cuda --model "$SYNTH_DIR" --port 8765 --max-num-seqs 64 > "$OUT/serve.log" 2>&1 &
  serve_pid=$!
  for _ in $(seq 1 120); do curl -sf localhost:8765/health >/dev/null && break; sleep 1; done
  completion=$(curl -s -m 60 localhost:8765/v1/completions -H 'Content-Type: application/json' \
    -d '{"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}')
  chat_events=$(curl -sN -m 60 localhost:8765/v1/chat/completions -H 'Content-Type: application/json' \
    -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": true, "ignore_eos": true}' | grep -c '^data:')
  kill -TERM $serve_pid; wait $serve_pid
  results+=("$(printf '%-28s       %s' "serve cuda: completion" "$(echo "$completion" | head -c 200)")")
  results+=("$(printf '%-28s       %s' "serve cuda: chat stream" "$chat_events data events (8 tokens + role + finish/usage + DONE expected)")")
fi

# The openai-client server tests against nibble serve --backend cuda (device_env.sh's test_wheels).
if (has openai || has load) && ! test_wheels; then
  results+=("$(printf '%-28s       %s' "openai/load tests, cuda" "skipped: no openai/pytest/requests (run scripts/device_wheels.sh here and carry .whl)")")
elif has openai || has load; then
  if has openai; then
    NIBBLE_BUILD_DIR="$PWD/build-device" NIBBLE_TEST_PRESET=small-moe NIBBLE_TEST_SERVE_ARGS="--backend cuda" \
      NIBBLE_TEST_SERVER_MODEL="$SYNTH_DIR" timeout 300 \
      python3 -m pytest -q -p no:cacheprovider tests/python/test_server_openai.py > "$OUT/pytest_server_cuda.log" 2>&1
    results+=("$(printf '%-28s rc=%d  %s' "openai tests, serve cuda" "$?" "$(tail -1 "$OUT/pytest_server_cuda.log")")")
  fi
  if has load; then
    # Issue 16: the load tests on the GPU — 2000 open streams, disconnects freeing KV blocks,
    # preemption, a weight swap under traffic — on the small GPU-sized checkpoints (the swap needs
    # two of a layout), then the 2000 streams again on the full-size one. A fixed KV budget per
    # server: several tests run a second server beside the module's, and the measured sizing counts
    # the first one's memory against the card's share.
    NIBBLE_BUILD_DIR="$PWD/build-device" NIBBLE_TEST_PRESET=small-moe NIBBLE_TEST_SERVE_ARGS="--backend cuda --kv-cache-memory-gb 2" \
      timeout 240 python3 -m pytest -q -p no:cacheprovider tests/python/test_server_load.py > "$OUT/pytest_load_cuda.log" 2>&1
    results+=("$(printf '%-28s rc=%d  %s' "load tests, serve cuda" "$?" "$(tail -1 "$OUT/pytest_load_cuda.log")")")
    NIBBLE_BUILD_DIR="$PWD/build-device" NIBBLE_TEST_PRESET=small-moe NIBBLE_TEST_SERVE_ARGS="--backend cuda" \
      NIBBLE_TEST_SERVER_MODEL="$SYNTH_DIR" timeout 240 python3 -m pytest -q -s -p no:cacheprovider \
      tests/python/test_server_load.py -k "2000 or disconnect" > "$OUT/pytest_load_full.log" 2>&1
    results+=("$(printf '%-28s rc=%d  %s' "2000 streams, full-size cuda" "$?" "$(grep -h '\[load\]' "$OUT/pytest_load_full.log" | head -1) $(tail -1 "$OUT/pytest_load_full.log")")")
  fi
fi

# ERNIE-4.5 (issue 17): its own script, its own table.
if has ernie; then timeout 300 bash scripts/device_ernie.sh > "$OUT/ernie.txt" 2>&1; fi

grep -h "differ" "$OUT"/test_cuda_*.log > "$OUT/differ.txt" 2> /dev/null
echo "== device run ($(nproc) cores, disk: $(cat "$OUT/disk.txt")) =="
for t in "$OUT"/test_cuda_*.log; do [ -f "$t" ] && grep -hE "Failure|Expected|actual|^mode|^512" "$t" | head -8; done
printf '%s\n' "${results[@]}"
if [ -f "$OUT/latency.log" ]; then grep -vE "^\[nibble" "$OUT/latency.log"; fi
[ -f "$OUT/ernie.txt" ] && cat "$OUT/ernie.txt"
