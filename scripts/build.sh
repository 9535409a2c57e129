#!/usr/bin/env bash
# Configures (once) and builds nibble into build/ (CLI at build/nibble). Extra arguments go to the
# first configure, e.g. -DNIBBLE_CUDA=off for a CPU-only build.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${NIBBLE_BUILD_DIR:-build}
# ccache keys relative to the checkout's parent, the build directory left out: a baseline worktree
# beside this checkout (`scripts/device.sh baseline`) reuses this build's objects.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(dirname "$PWD")} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja "$@" >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
