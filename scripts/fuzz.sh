#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) into build-fuzz/ and runs each for
# SECONDS (default 60). Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-60}
if [ ! -f build-fuzz/build.ninja ]; then
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DNIBBLE_CUDA=off -DNIBBLE_FUZZ=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build build-fuzz --target fuzz_safetensors
mkdir -p build-fuzz/corpus/safetensors
# Work corpus in build-fuzz/, seeded from the committed tests/fuzz/corpus.
build-fuzz/tests/fuzz_safetensors build-fuzz/corpus/safetensors tests/fuzz/corpus/safetensors \
  -max_total_time="$SECONDS_PER_TARGET" \
  -max_len=4096 2>&1 | grep -E "INITED|DONE|ERROR|SUMMARY|Done"
