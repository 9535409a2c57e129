# What every GPU subcommand of scripts/device.sh shares (sourced once, on the GPU machine, from the
# repo root, build-device/ carried): $OUT for logs, the carried libraries and the tokenizer data, the
# full-size synthetic checkpoint written once per machine (synth_full: Qwen3-30B-A3B unless SYNTH_PRESET), the
# baseline binaries, the openai-client wheels, and Nsight Compute's helpers.
OUT=${OUT:-/tmp/nibble-device}
# `scripts/device.sh bundle` and `baseline` carry their binaries xz-compressed (DIR/bins.tar.xz, 5x
# smaller); python's tarfile unpacks them where tar has no xz.
unpack_bins() {
  tar -C "$1" -xJf "$1/bins.tar.xz" 2>/dev/null ||
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1] + '/bins.tar.xz').extractall(sys.argv[1])" "$1"
}
if [ -f build-device/bins.tar.xz ] && [ ! -x build-device/nibble ]; then unpack_bins build-device; fi
mkdir -p "$OUT"
# A call brings back at most 8 files from $OUT: the driver packs what was written there (two folders
# down; files under 16 MiB, not the .tar.gz / .tar.xz artifacts a subcommand means to return as they
# are) into 0logs.tar.gz as it exits — first by name, so all of it comes back.
pack_logs() {
  local list=/tmp/nibble-pack-$$.list
  (cd "$OUT" && find . -maxdepth 3 -type f -size -16M ! -name '*.tar.gz' ! -name '*.tar.xz' ! -name '*.part-*' -print0 > "$list" &&
    [ -s "$list" ] && tar -czf 0logs.tar.gz --null -T "$list" 2> /dev/null) || true
  rm -f "$list"
}
trap pack_logs EXIT
export NIBBLE_DATA_DIR="$PWD/data"
export LD_LIBRARY_PATH="$PWD/build-device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Tensor parallelism loads libnccl.so.2 at start: PyTorch's nvidia-nccl-cu13 wheel has it. NVLink
# multicast stays off on these machines (the device tool's KINDS.md).
nccl_lib=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
[ -n "$nccl_lib" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$nccl_lib"
export NCCL_NVLS_ENABLE=0
# SYNTH_ROUTER_SKEW=S: the full-size checkpoint's routers placed for Zipf S (`synth --router-skew`, ~50 s
# more): every subcommand then measures at trained-like expert loads (docs/perf.md "Expert loads").
# SYNTH_PRESET: another `nibble synth --preset` for every subcommand (issue 68's rows: qwen3-235b-a22b,
# ~130 GB: a machine whose disk cannot hold it takes SYNTH_DIR=/dev/shm/…, in host memory).
SYNTH_PRESET=${SYNTH_PRESET:-qwen3-30b-a3b}
SYNTH_DIR=${SYNTH_DIR:-/tmp/$SYNTH_PRESET-synth${SYNTH_ROUTER_SKEW:+-skew-$SYNTH_ROUTER_SKEW}}

# build-base/'s binaries (`scripts/device.sh baseline`), unpacked once.
unpack_baseline() { [ -e build-base/nibble ] || unpack_bins build-base; }

# The `bench latency` argument sets of RUNS (";"-separated shell words) as the array `runs`, and one of
# them as the array `args` (bench_run_args SET), with --modes "${MODES:-none}" where the set names none.
bench_runs() { IFS=';' read -r -a runs <<< "$RUNS"; }
bench_run_args() {
  eval "args=($1)"
  case " $1 " in *" --modes "*) ;; *) args+=(--modes "${MODES:-none}") ;; esac
}

# split_settings ITEMS…: a variant's NAME=VALUE items (its environment) into the caller's array
# `vars`, the rest (flags and their values) into `flags`.
split_settings() {
  local item
  vars=() flags=()
  for item in "$@"; do
    if [[ $item =~ ^[A-Z_][A-Z0-9_]*= ]]; then vars+=("$item"); else flags+=("$item"); fi
  done
}

synth_full() {
  [ -f "$SYNTH_DIR/config.json" ] ||
    build-device/nibble synth --preset "$SYNTH_PRESET" --out "$SYNTH_DIR" --seed 0 \
      ${SYNTH_ROUTER_SKEW:+--router-skew "$SYNTH_ROUTER_SKEW"} > "$OUT/synth.log" 2>&1
}

# The openai-client server tests need openai, pytest and requests, which the machine's python lacks:
# `scripts/device.sh wheels` fetches them here as wheels (carry ".whl"). Returns 0 when importable.
test_wheels() {
  if [ -d .whl ] && [ ! -d /tmp/site ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      > "$OUT/wheels.log" 2>&1
  fi
  [ -d /tmp/site ] && export PYTHONPATH=/tmp/site
  python3 -c "import openai, pytest, requests" 2>/dev/null
}

# Nsight Compute's key counters (time, DRAM, issue, pipes, stall reasons) of PROFILE_KERNEL (a regex;
# its first two launches) in `BIN bench kernels ARGS...`: key_metrics CSV BIN ARGS... prints one line.
KEY_METRICS=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
lts__t_sector_hit_rate.pct,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,\
sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,\
sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,\
smsp__inst_executed.sum,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio
key_metrics() {
  local csv=$1 bin=$2; shift 2
  timeout 150 ncu --clock-control none --kernel-name "regex:$PROFILE_KERNEL" --launch-count 2 --csv --metrics "$KEY_METRICS" \
    "$bin" bench kernels "$@" --iterations 1 --batches 1 > "$csv" 2>&1
  python3 -c "
import csv, re, sys
short = {'gpu__time_duration': 'us', 'dram__throughput': 'dram%', 'lts__t_sector_hit_rate': 'l2hit%',
         'smsp__issue_active': 'issue%', 'sm__warps_active': 'warps%', 'sm__inst_executed_pipe_alu': 'alu%',
         'sm__inst_executed_pipe_fma': 'fma%', 'sm__inst_executed_pipe_lsu': 'lsu%',
         'sm__pipe_tensor_cycles_active': 'tensor%', 'smsp__inst_executed': 'inst'}
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 12 and r[-3] != 'Metric Name']
last = None
for r in rows:
    m = re.search(r'(\\w+_kernel)(<[^>]*>)?', r[4])
    name = (m.group(1) + (m.group(2) or '')).replace(' ', '') if m else r[4][:24]
    if (r[0], name) != last: print('|', name, end=' '); last = (r[0], name)
    metric = r[-3].split('.')[0]
    label = short.get(metric, metric.replace('smsp__average_warps_issue_stalled_', '').replace('_per_issue_active', ''))
    value = r[-1].replace(',', '')
    if metric == 'gpu__time_duration': value = '%.1f' % (float(value) / (1000 if r[-2] == 'nsecond' else 1))
    print(label + '=' + value, end=' ')
" "$csv" 2>&1
}

# Nsight Compute's per-kernel durations (a CSV of `ncu --csv --metrics gpu__time_duration.sum` on
# stdin) summed by kernel name from the last launch of a kernel whose name contains $1 (the start of
# the last step or forward) on: `ncu_kernel_table embedding_kernel < ncu.csv`; or, $1 a number, over
# that many last launches (a run that timed only some kernels).
ncu_kernel_table() {
  python3 -c "
import csv, sys, collections
rows = [r for r in csv.reader(sys.stdin) if len(r) > 10 and r[-3] == 'gpu__time_duration.sum']
names = [r[4].replace('void ', '').replace('nibble::<unnamed>::', '').replace('nibble::cuda::', '').split('(')[0] for r in rows]
starts = [len(names) - int('$1')] if '$1'.isdigit() else [i for i, n in enumerate(names) if '$1' in n] or [0]
step = list(zip(names, rows))[starts[-1]:]
total = collections.defaultdict(float); count = collections.Counter()
for n, r in step: total[n] += float(r[-1].replace(',', '')) / 1e3; count[n] += 1
s = sum(total.values())
print(f'{len(step)} kernels, {s:.1f} us of GPU time')
for n, t in sorted(total.items(), key=lambda kv: -kv[1]): print(f'{n[:70]:70s} {count[n]:5d} {t:9.1f} us {100*t/s:5.1f}%')
"
}

# The 4-layer slice of Qwen3-30B-A3B (seed 1) the runner's GPU-against-CPU test reads.
SLICE_DIR=${SLICE_DIR:-/tmp/qwen3-30b-a3b-4l}
synth_slice() {
  [ -f "$SLICE_DIR/config.json" ] ||
    build-device/nibble synth --preset qwen3-30b-a3b --layers 4 --out "$SLICE_DIR" --seed 1 > "$OUT/synth4.log" 2>&1
}

# The slice again with Qwen's YaRN recipe in its config.json (factor 4 over 32,768 positions; the
# weights linked): YaRN changes the low frequencies and scales cos/sin at every position, so short
# prompts test it too. Its folder is $SLICE_DIR-yarn.
YARN_JSON='{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}'
synth_slice_yarn() {
  synth_slice
  [ -f "$SLICE_DIR-yarn/config.json" ] && return
  mkdir -p "$SLICE_DIR-yarn"
  for f in "$SLICE_DIR"/*; do [ "$(basename "$f")" = config.json ] || ln -sf "$f" "$SLICE_DIR-yarn/"; done
  python3 -c "import json, sys; c = json.load(open(sys.argv[1])); c['rope_scaling'] = json.loads(sys.argv[2]);
json.dump(c, open(sys.argv[3], 'w'), indent=2)" "$SLICE_DIR/config.json" "$YARN_JSON" "$SLICE_DIR-yarn/config.json"
}

# One line of a `bench latency` log's rows: mode/ppN=tok/s, mode/bB=tok/s, mode/mix=ms.
latency_summary() {
  awk '$2 ~ /^(pp|tg)[0-9]/ {printf "%s/%s=%s ", $1, $2, $4} $2 == "S_TG" {printf "%s/%s=%s ", $1, $3, $5}
       $2 == "mix" {printf "%s/%s=%sms ", $1, $3, $6}' "$1"
}

# A gtest log's verdict, or what stopped it (a crash, a timeout, a binary not bundled).
gtest_verdict() {
  local verdict running
  verdict=$(grep -hE "^\[  (PASSED|FAILED|SKIPPED) " "$1" 2>/dev/null | tr '\n' ' ')
  # Cut short (its timeout, a crash, a hang): the test it was in, and the log's last line.
  running=$(grep -hE "^\[ RUN      \]" "$1" 2>/dev/null | tail -1 | sed 's/^\[ RUN      \] //')
  echo "${verdict:-NOT RUN TO THE END${running:+ (in $running)}: $(tail -1 "$1" 2>/dev/null)}"
}
