# Sourced by the device scripts (run on the GPU machine from the repo root, build-device/ carried):
# $OUT for logs, the carried libraries and the tokenizer data, and the full-size synthetic
# Qwen3-30B-A3B checkpoint written once per machine (synth_qwen3_full).
OUT=${OUT:-/tmp/nibble-device}
# scripts/device_bundle.sh carries the binaries gzipped (they are 4x smaller so).
if [ -f build-device/bins.tar.gz ] && [ ! -x build-device/nibble ]; then tar -C build-device -xzf build-device/bins.tar.gz; fi
mkdir -p "$OUT"
export NIBBLE_DATA_DIR="$PWD/data"
export LD_LIBRARY_PATH="$PWD/build-device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
SYNTH_DIR=${SYNTH_DIR:-/tmp/qwen3-30b-a3b-synth}

synth_qwen3_full() {
  [ -f "$SYNTH_DIR/config.json" ] ||
    build-device/nibble synth --preset qwen3-30b-a3b --out "$SYNTH_DIR" --seed 0 > "$OUT/synth.log" 2>&1
}

# The openai-client server tests need openai, pytest and requests, which the machine's python lacks:
# scripts/device_wheels.sh fetches them here as wheels (carry ".whl"). Returns 0 when importable.
test_wheels() {
  if [ -d .whl ] && [ ! -d /tmp/site ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      > "$OUT/wheels.log" 2>&1
  fi
  [ -d /tmp/site ] && export PYTHONPATH=/tmp/site
  python3 -c "import openai, pytest, requests" 2>/dev/null
}
