#!/usr/bin/env bash
# `scripts/device.sh bundle`: collects the binaries a device run needs into build-device/ (stripped and
# xz-compressed into one bins.tar.xz, ~30% smaller than gzip's; common.sh unpacks it there); send it
# with carry: ["build-device"] and run scripts/device.sh there. BUNDLE_TESTS="moe runner …"
# packs only those GPU test binaries (and not the server tests' route table tool): a bundle of all is ~37 MB (xz):
# with the tracked tree (~27 MB) that passes the 64 MiB a call carries: split the binaries over calls.
# BUNDLE_CUPTI=1 adds the toolkit's CUPTI library (4 MB), which NIBBLE_DIAG_KERNEL_TRACE loads.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/build.sh >/dev/null
rm -rf build-device && mkdir -p build-device/tests build-device/bench
cp build/nibble build-device/
for b in l2_bandwidth cublaslt_probe; do [ -x "build/bench/$b" ] && cp "build/bench/$b" build-device/bench/; done
if [ -n "${BUNDLE_TESTS:-}" ]; then
  for t in $BUNDLE_TESTS; do cp "build/tests/test_cuda_$t" build-device/tests/; done
else
  find build/tests -maxdepth 1 -name "test_cuda_*" -type f -executable -exec cp {} build-device/tests/ \;
  cp build/tests/route_table_tool build-device/tests/  # test_server_load.py's api-key test reads the route table
fi
strip build-device/nibble build-device/tests/* build-device/bench/* 2>/dev/null || true
# Debian libraries the device machine does not have (it is not set up by scripts/setup.sh).
mkdir -p build-device/lib
for lib in libutf8proc.so.2 libpcre2-8.so.0 libsentencepiece.so.0 libsentencepiece_train.so.0; do
  cp "$(ldd build/nibble | awk -v l="$lib" '$1 == l {print $3}')" build-device/lib/
done
if [ "${BUNDLE_CUPTI:-0}" = 1 ]; then
  cupti=$(find /usr/local/cuda/lib64/ /usr/local/cuda/lib/ /usr/local/cuda/extras/CUPTI/lib64/ -name 'libcupti.so.13' 2>/dev/null | head -1 || true)
  [ -n "$cupti" ] && cp -L "$cupti" build-device/lib/ || echo "BUNDLE_CUPTI: no libcupti.so.13 in the CUDA toolkit" >&2
fi
tar -C build-device -cf - nibble tests bench | xz -6 -T0 > build-device/bins.tar.xz
rm -rf build-device/nibble build-device/tests build-device/bench
du -sh build-device
# What a call would carry with this bundle (the tree git sends, and build-base/ and .whl where they
# exist): over 64 MiB the call is refused, so say so here rather than there.
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 cat 2>/dev/null | wc -c)
carried=(build-device); for d in build-base .whl; do [ -d "$d" ] && carried+=("$d"); done
extra=$(du -scb "${carried[@]}" | tail -1 | cut -f1)
total=$((tree + extra))
echo "a call carrying ${carried[*]}: $((total / 1048576)) MiB of 64 (the tree $((tree / 1048576)))"
[ "$total" -le $((64 * 1048576)) ] || echo "over the 64 MiB a call carries: bundle fewer tests (BUNDLE_TESTS) or leave build-base out" >&2
