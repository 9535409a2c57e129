#!/usr/bin/env bash
# `scripts/device.sh baseline COMMIT…`: baseline commits' `nibble` for same-call A/B runs on the device: for each COMMIT (default
# HEAD) a git worktree under /tmp, the nibble target only (ccache makes an unchanged tree quick),
# stripped as build-base/nibble-<commit>, the first also as build-base/nibble; packed (xz: 8.5 MB a
# binary, gzip's 12) as build-base/bins.tar.xz, which `BASELINE=1 scripts/device.sh latency` (every build-base/nibble-*) and
# `BASELINE=1 scripts/device.sh kernels` (build-base/nibble) unpack there. Send it with carry:
# ["build-device", "build-base"] (8.5 MB a binary of the 64 MiB). The worktrees sit beside this checkout
# and ccache rewrites paths relative to their common parent (and leaves the build directory out of
# its hash), so a baseline recompiles only the files that differ from the last build here.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(dirname "$PWD")} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
[ $# -gt 0 ] || set -- HEAD
rm -rf build-base && mkdir -p build-base
first=""
for ref in "$@"; do
  commit=$(git rev-parse --verify "$ref^{commit}")
  tree=$(dirname "$PWD")/nibble-baseline-${commit:0:12}
  if [ ! -d "$tree" ]; then
    git worktree prune
    git worktree add --detach "$tree" "$commit" >/dev/null
  fi
  [ -e "$tree/.deps" ] || ln -s "$PWD/.deps" "$tree/.deps"  # FlashInfer's headers from scripts/setup.sh
  [ -f "$tree/build/build.ninja" ] || cmake -S "$tree" -B "$tree/build" -G Ninja >/dev/null
  cmake --build "$tree/build" --target nibble -j "$(nproc)" >/dev/null
  strip -o "build-base/nibble-${commit:0:12}" "$tree/build/nibble"
  [ -n "$first" ] || { first=${commit:0:12}; ln -s "nibble-$first" build-base/nibble; }
done
(cd build-base && tar -cf - nibble nibble-* | xz -6 -T0 > bins.tar.xz && rm -f nibble nibble-*)
echo "build-base/bins.tar.xz: nibble of $* ($(du -h build-base/bins.tar.xz | cut -f1))"
