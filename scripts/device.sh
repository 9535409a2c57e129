#!/usr/bin/env bash
# The device driver: every run on a GPU machine, and the preparation of those runs here, behind one
# entry point. Each subcommand is a file in scripts/device/ whose header says what it does and which
# NAME=VALUE settings (environment variables) it reads.
#
#   Here, on the build machine:
#     scripts/device.sh bundle             build-device/: the binaries a run needs (carry it)
#     scripts/device.sh baseline COMMIT…   build-base/: those commits' nibble, for same-call A/B runs
#     scripts/device.sh wheels             .whl/: the openai-client tests' wheels for the GPU machine
#   There, from the repo root (carry build-device, and build-base / .whl where used); several
#   subcommands run in order in one call, logs under $OUT, each one's table at its end:
#     tests      GPU test binaries, the 4-layer slice against the CPU, the server tests on the GPU
#     latency    `nibble bench latency` on the full-size model; variants and baselines side by side
#     kernels    `nibble bench kernels` with the torch BF16 baselines
#     serve      serving workloads (FastDeploy's shape, SGLang's gsm8k) against `nibble serve`
#     timeline   every kernel of a step, CUDA graphs included (CUPTI)
#     profile    Nsight Compute: a kernel, a step's kernels, the step profiler, ops run twice
#     synth      the full-size checkpoint's write speed and inspect
#     long-context  YaRN at 32k-128k: prefill and decode speed, torch's attention, the server's tests
#     routing    the MoE rows and `bench latency` at uniform and at Zipf-skewed expert loads
#     ernie      ERNIE-4.5-MoE's GPU tests and benchmarks
#     train-tiny trains the default model and measures its accuracy in every mode
set -uo pipefail
DEVICE_DIR="$(cd "$(dirname "$0")" && pwd)/device"
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
[ $# -gt 0 ] || { usage; exit 2; }
case "$1" in
  help | -h | --help) usage; exit 0 ;;
  bundle | baseline | wheels)
    cmd=$1; shift
    exec bash "$DEVICE_DIR/$cmd.sh" "$@" ;;
esac
for cmd in "$@"; do
  [ -f "$DEVICE_DIR/${cmd//-/_}.sh" ] && [ "$cmd" != common ] || { echo "unknown subcommand '$cmd'" >&2; usage >&2; exit 2; }
done
cd "$DEVICE_DIR/../.."
source "$DEVICE_DIR/common.sh"
status=0
for cmd in "$@"; do
  echo "===== device.sh $cmd"
  (source "$DEVICE_DIR/${cmd//-/_}.sh") || status=1
done
exit $status
