#!/usr/bin/env bash
# Builds a baseline commit's `nibble` for same-call A/B runs on the device: a git worktree of COMMIT
# (default HEAD) under /tmp, the nibble target only (ccache makes an unchanged tree quick), stripped
# and packed as build-base/bins.tar.gz, which scripts/device_ab.sh and `BASELINE=1
# scripts/device_quick.sh` unpack there. Send it with carry: ["build-device", "build-base"].
set -euo pipefail
cd "$(dirname "$0")/.."
commit=$(git rev-parse --verify "${1:-HEAD}^{commit}")
tree=/tmp/nibble-baseline-${commit:0:12}
if [ ! -d "$tree" ]; then
  git worktree prune
  git worktree add --detach "$tree" "$commit" >/dev/null
fi
[ -e "$tree/.deps" ] || ln -s "$PWD/.deps" "$tree/.deps"  # FlashInfer's headers from scripts/setup.sh
[ -f "$tree/build/build.ninja" ] || cmake -S "$tree" -B "$tree/build" -G Ninja >/dev/null
cmake --build "$tree/build" --target nibble -j "$(nproc)" >/dev/null
rm -rf build-base && mkdir -p build-base
strip -o build-base/nibble "$tree/build/nibble"
tar -C build-base -czf build-base/bins.tar.gz nibble && rm build-base/nibble
echo "build-base/bins.tar.gz: nibble of ${commit:0:12} ($(du -h build-base/bins.tar.gz | cut -f1))"
