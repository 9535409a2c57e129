#!/usr/bin/env bash
# Configures (once) and builds nibble into build/ (CLI at build/nibble). Extra arguments go to the
# first configure, e.g. -DNIBBLE_CUDA=off for a CPU-only build.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${NIBBLE_BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja "$@" >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
