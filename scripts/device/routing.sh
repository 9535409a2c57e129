# `scripts/device.sh routing`: the MoE at uniform and at Zipf-skewed expert loads (issue 69 §3). For
# each of SKEWS ("random" = the plain synth's router rows, or a Zipf exponent: 0 is uniform): the MoE
# block's rows (`bench kernels --ops moe --router-skew S`, MOE_TOKENS, MOE_BACKEND default auto), a
# full-size synthetic Qwen3-30B-A3B whose routers are placed for S (`nibble synth --router-skew S`,
# its log names the loads reached), the loads one ROUTING_TOKENS-token prompt meets in it (`bench
# routing`, on the CPU: ~1.5 min at 2,048; 0 skips) and `bench latency $LATENCY` on it. One skewed
# checkpoint on disk at a time (18 GB each). A table of both last.
SKEWS=${SKEWS:-random 0 0.6}
MOE_TOKENS=${MOE_TOKENS:-1,4,8,16,32,64,128,512,2048,8192}
LATENCY=${LATENCY:---modes none --pp 2048 --tg 128 --batches 64,128}
eval "latency=($LATENCY)"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"
for s in $SKEWS; do
  skew=(); [ "$s" = random ] || skew=(--router-skew "$s")
  timeout 400 build-device/nibble bench kernels --ops moe --moe-backend "${MOE_BACKEND:-auto}" \
    --moe-tokens "$MOE_TOKENS" "${skew[@]}" --json "$OUT/kernels_$s.json" > "$OUT/kernels_$s.txt" 2>&1
  echo "== bench kernels --ops moe, routing $s (rc $?)"
  dir=/tmp/qwen3-30b-a3b-skew-$s
  [ "$s" = random ] && { dir=/tmp/qwen3-30b-a3b-synth; SYNTH_ROUTER_SKEW='' SYNTH_DIR=$dir synth_full; }
  if [ "$s" != random ]; then
    /usr/bin/time -f "synth %e s" build-device/nibble synth --preset qwen3-30b-a3b --out "$dir" --seed 0 "${skew[@]}" \
      --router-tokens "${ROUTER_TOKENS:-1024}" > "$OUT/synth_$s.log" 2>&1
    echo "== synth, routing $s (rc $?)"; grep -A7 "^routers placed" "$OUT/synth_$s.log"
  fi
  if [ "${ROUTING_TOKENS:-2048}" != 0 ]; then
    timeout 400 build-device/nibble bench routing --model "$dir" --tokens "${ROUTING_TOKENS:-2048}" \
      --json "$OUT/routing_$s.json" > "$OUT/routing_$s.txt" 2>&1
    echo "== bench routing, routing $s (rc $?)"; grep "^min-max" "$OUT/routing_$s.txt"
  fi
  timeout 400 build-device/nibble bench latency --model "$dir" --backend cuda --batch-prompt 1000 --batch-gen 32 \
    "${latency[@]}" > "$OUT/latency_$s.log" 2>&1
  echo "== bench latency, routing $s (rc $?)"
  [ "$s" = random ] || rm -rf "$dir"
done
cat "$OUT/gpu.txt"
python3 - "$OUT" $SKEWS <<'PY'
import json, re, sys
out, skews = sys.argv[1], sys.argv[2:]
rows = {}
for s in skews:
    try:
        for r in json.load(open(f"{out}/kernels_{s}.json")):
            if r.get("op") == "moe":
                rows.setdefault((r["tokens"], r["backend"], r["mode"]), {})[s] = r["time_us"]
    except (OSError, ValueError):
        pass
print("MoE block, us (ratio to the first skew)")
print(f"{'T':>6} {'backend/mode':<28}" + "".join(f"{s:>16}" for s in skews))
for (t, b, m), v in sorted(rows.items()):
    first = v.get(skews[0])
    cells = "".join(f"{v[s]:>9.1f} {v[s] / first:5.2f}x" if s in v and first else f"{'-':>16}" for s in skews)
    print(f"{t:>6} {b + '/' + m:<28}{cells}")
print("bench latency, tok/s")
for s in skews:
    try:
        text = open(f"{out}/latency_{s}.log").read()
    except OSError:
        continue
    picked = [l.strip() for l in text.splitlines() if re.match(r"(none|static|per-token)\s", l)]
    print(f"-- {s}"); print("\n".join(picked))
PY
