#!/usr/bin/env bash
# Builds nibble and runs every test: ctest (C++, GPU tests skip visibly without a GPU), then pytest
# (differential tests against the Python references). Ends with both summaries.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
bash scripts/build.sh || exit 1
BUILD_DIR=${NIBBLE_BUILD_DIR:-build}
export NIBBLE_BUILD_DIR="$PWD/$BUILD_DIR"

ctest_log=$(mktemp)
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)") 2>&1 | tee "$ctest_log"
ctest_rc=${PIPESTATUS[0]}

pytest_log=$(mktemp)
.venv/bin/python -m pytest -q 2>&1 | tee "$pytest_log"
pytest_rc=${PIPESTATUS[0]}

echo
echo "== summary =="
grep -E "tests passed|tests failed" "$ctest_log" | sed 's/^/ctest:  /'
if grep -q "(Skipped)" "$ctest_log"; then
  echo "ctest:  GPU tests skipped (no CUDA device on this machine): $(grep -c '(Skipped)' "$ctest_log")"
fi
tail -n 1 "$pytest_log" | sed 's/^/pytest: /'
rm -f "$ctest_log" "$pytest_log"
[ "$ctest_rc" -eq 0 ] && [ "$pytest_rc" -eq 0 ]
