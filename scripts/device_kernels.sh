#!/usr/bin/env bash
# Kernel benchmarks on the device machine (build-device/ carried): `nibble bench kernels` and the
# torch BF16 baseline in the same call; logs under $OUT, the tables last.
set -uo pipefail
OUT=${OUT:-/tmp/nibble-device}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/build-device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
M=${M:-1,8,16,128,1024,8192}
build-device/nibble bench kernels --m "$M" --json "$OUT/kernels.json" > "$OUT/kernels.txt" 2>&1
python3 bench/torch_linear_baseline.py --m "$M" > "$OUT/torch.txt" 2>&1
cat "$OUT/kernels.txt" "$OUT/torch.txt"
