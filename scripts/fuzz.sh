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
for target in safetensors jinja chat_request tokenizer grammar; do
  cmake --build build-fuzz --target "fuzz_$target"
  mkdir -p "build-fuzz/corpus/$target"
  # Work corpus in build-fuzz/, seeded from the committed tests/fuzz/corpus.
  echo "fuzz_$target:"
  "build-fuzz/tests/fuzz_$target" "build-fuzz/corpus/$target" "tests/fuzz/corpus/$target" \
    -max_total_time="$SECONDS_PER_TARGET" -max_len=8192 -timeout=10 2>&1 | grep -E "INITED|DONE|ERROR|SUMMARY|Done"
done
