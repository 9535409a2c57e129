#!/usr/bin/env bash
# One device call (build-device/ carried) for the wgmma GEMMs and the decode-attention choice: the
# GPU tests of the kernels and the runner, `nibble bench kernels` at prefill sizes for every
# backend, then `nibble bench latency` on the full-size synthetic Qwen3-30B-A3B: prefill with each
# MoE / dense backend, decode with each --decode-attention. PARTS=tests,kernels,prefill,decode picks.
# (Kernel variants chosen by environment: scripts/device_variants.sh with BACKEND=wgmma.)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
PARTS=${PARTS:-tests,kernels,prefill,decode}
M=${M:-128,512,2048,8192}
MOE_TOKENS=${MOE_TOKENS:-128,512,2048,8192}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
results=()
if has tests; then
  for t in test_cuda_linear test_cuda_moe test_cuda_runner; do
    timeout 150 "build-device/tests/$t" > "$OUT/$t.log" 2>&1
    results+=("$(printf '%-18s rc=%d  %s' "$t" "$?" "$(grep -E "^\[  (PASSED|FAILED) " "$OUT/$t.log" | tr '\n' ' ')")")
  done
fi
if has kernels; then
  timeout 240 build-device/nibble bench kernels --ops dense,moe --m "$M" --moe-tokens "$MOE_TOKENS" --gemm-backend all \
    --moe-backend all --json "$OUT/kernels.json" > "$OUT/kernels.txt" 2>&1
  results+=("$(printf '%-18s rc=%d' "bench kernels" "$?")")
fi
if has prefill || has decode; then synth_qwen3_full; fi
latency() {  # name, then bench latency flags
  local name=$1; shift
  timeout 200 build-device/nibble bench latency --model "$SYNTH_DIR" --backend cuda --modes none --batch-prompt 1000 \
    --batch-gen 32 --json "$OUT/latency_$name.json" "$@" > "$OUT/latency_$name.log" 2>&1
  results+=("$(printf '%-18s rc=%d  %s' "latency $name" "$?" "$(awk '$2 ~ /^(pp|tg)[0-9]/ {printf "%s=%s ", $2, $4} $2 == "S_TG" {printf "%s=%s ", $3, $5}' "$OUT/latency_$name.log")")")
}
if has prefill; then
  latency moe-fused --pp 512,2048 --tg 0 --batches "" --moe-backend fused
  latency moe-wgmma --pp 512,2048 --tg 0 --batches "" --moe-backend wgmma
  latency all-wgmma --pp 512,2048 --tg 0 --batches "" --moe-backend wgmma --gemm-backend wgmma
fi
if has decode; then
  for choice in ${DECODE_CHOICES:-split-kv tensor-core}; do latency "$choice" --pp 512 --tg 128 --batches 1,16,64,128 --decode-attention "$choice"; done
fi
for t in "$OUT"/test_cuda_*.log; do grep -hE "Failure|Expected|actual|error|Which is" "$t" | head -6; done
grep -hE "wgmma" "$OUT"/test_cuda_*.log | sort -k8 -g | tail -3
[ -f "$OUT/kernels.txt" ] && grep -E "^op|w4a16" "$OUT/kernels.txt" | grep -vE "fused/|skinny/" | head -60
printf '%s\n' "${results[@]}"
