# `scripts/device.sh long-context`: long context on the GPU, the full-size synthetic Qwen3-30B-A3B with
# Qwen's YaRN recipe ($YARN_JSON). PARTS (default "prefill torch server decode") picks:
#   prefill  `bench latency` pp32768 and pp131072 (PP) in 8,192-token chunks (the server's default step),
#            and again under NIBBLE_DIAG_PROFILE_STEPS for attention's share of the step
#   torch    torch's SDPA backends on one layer's attention of the same shapes (bench/torch_attention_baseline.py)
#   server   test_server_long_context.py's full-size tests (.whl carried): 32k / 64k / 128k requests,
#            a cached 32k document, preemption of long requests, an FP8 KV cache at 128k (SERVER_K: a
#            pytest -k expression among them, default all)
#   decode   `bench latency --context` 1,024 / 32,768 / 131,008 for 1, 8 and 32 sequences, BF16 and FP8
#            KV (KV_DTYPES; CONTEXTS entries CONTEXT or CONTEXT:BATCHES, DECODE_BATCHES the default
#            batches), and each row's KV bytes a step against the HBM floor (HBM_TB_S)
PARTS=${PARTS:-prefill torch server decode}
PP=${PP:-32768,131072}
synth_full
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
results=()
bench_long() {  # bench_long TAG ARGS...: one `bench latency` run with the YaRN config
  local tag=$1; shift
  timeout 590 build-device/nibble bench latency --model "$SYNTH_DIR" --backend cuda --rope-scaling "$YARN_JSON" \
    --modes none --tg 0 "$@" > "$OUT/long_$tag.log" 2>&1
  results+=("$(printf '%-28s rc=%d' "$tag" "$?")")
  grep -E "^(none|#)" "$OUT/long_$tag.log"
}
for part in $PARTS; do
  case $part in
    prefill)
      bench_long prefill --pp "${PP:-32768,131072}" --prefill-chunk 8192 --repeats 1 --batches ''
      for n in ${PP//,/ }; do  # one length a run: the profiler sums a run's steps by kind
        NIBBLE_DIAG_PROFILE_STEPS=1 bench_long "prefill_ops_$n" --pp "$n" --prefill-chunk 8192 --repeats 1 --batches ''
        grep -E "steps:" "$OUT/long_prefill_ops_$n.log" | head -4
      done ;;
    torch)
      python3 bench/torch_attention_baseline.py > "$OUT/torch_attention.txt" 2>&1
      results+=("$(printf '%-28s rc=%d' torch_attention "$?")")
      cat "$OUT/torch_attention.txt" ;;
    server)
      if ! test_wheels; then results+=("server: skipped (carry .whl)"); continue; fi
      NIBBLE_BUILD_DIR="$PWD/build-device" NIBBLE_TEST_SERVE_ARGS="--backend cuda" NIBBLE_TEST_SERVER_MODEL="$SYNTH_DIR" \
        timeout 590 python3 -m pytest -q -s -p no:cacheprovider tests/python/test_server_long_context.py \
        -k "full_size and (${SERVER_K:-full_size})" \
        > "$OUT/pytest_long_context.log" 2>&1
      results+=("$(printf '%-28s rc=%d  %s' "server tests, 32k-128k" "$?" "$(tail -1 "$OUT/pytest_long_context.log")")")
      grep -E "^\[long\]|^(FAILED|ERROR)|Error" "$OUT/pytest_long_context.log" | head -12 ;;
    decode)
      for kv in ${KV_DTYPES:-bf16 fp8}; do
        # 131,008: 128k less the timed steps (the context length bounds them too)
        for spec in ${CONTEXTS:-1024 32768 131008}; do  # CONTEXT or CONTEXT:BATCHES (e.g. 131008:1)
          ctx=${spec%%:*} batches=${DECODE_BATCHES:-1,8,32}
          [ "$spec" != "$ctx" ] && batches=${spec#*:}
          bench_long "decode_${kv}_$ctx" --kv-cache-dtype "$kv" --pp '' --context "$ctx" --batches "$batches" \
            --batch-gen 32 --prefill-chunk 8192
        done
      done
      # KV bytes a step (48 layers, 4 KV heads of 128, K and V) against the HBM floor, and the bandwidth
      # of what the context adds: (KV bytes at C - at 1,024) / (step at C - step at 1,024), same batch.
      hbm=${HBM_TB_S:-$(grep -q H200 "$OUT/gpu.txt" && echo 4.8 || echo 3.35)}  # the cards' HBM3(e) peaks
      python3 - "$OUT" "$hbm" <<'PY'
import glob, os, re, sys
out, tbs = sys.argv[1], float(sys.argv[2])
rows = {}
for path in glob.glob(os.path.join(out, "long_decode_*.log")):
    kv = re.search(r"long_decode_(\w+?)_\d+\.log", path).group(1)
    for line in open(path):
        m = re.match(r"none\s+S_TG b(\d+) @(\d+)\s+\d+\s+([\d.]+)\s+([\d.]+)", line)
        if m:
            rows[(kv, int(m.group(2)), int(m.group(1)))] = (float(m.group(3)), float(m.group(4)))
print(f"{'kv':<5} {'context':>8} {'seqs':>5} {'tok/s':>9} {'ms/step':>8} {'KV GB':>7} {'KV floor ms':>11} {'ctx TB/s':>8}")
for (kv, ctx, b), (toks, ms) in sorted(rows.items()):
    per_token = 48 * 4 * 128 * 2 * (1 if kv == "fp8" else 2)
    kv_bytes = b * (ctx + 16) * per_token  # the timed steps' mean context
    base = rows.get((kv, 1024, b))
    extra = ""
    if base and ctx > 1024 and ms > base[1]:
        extra = f"{(kv_bytes - b * (1024 + 16) * per_token) / ((ms - base[1]) * 1e-3) / 1e12:8.2f}"
    print(f"{kv:<5} {ctx:>8} {b:>5} {toks:>9.1f} {ms:>8.3f} {kv_bytes / 1e9:>7.2f} {kv_bytes / tbs / 1e9:>11.3f} {extra:>8}")
PY
      ;;
    *) echo "long-context: unknown part '$part'"; results+=("unknown part $part rc=1") ;;
  esac
done
printf '%s\n' "${results[@]}"
