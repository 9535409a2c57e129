# `scripts/device.sh kernels`: `nibble bench kernels` on a model's shapes (OPS=dense,moe; M=… dense
# rows; MOE_TOKENS=…; EXTRA: more flags, e.g. "--gemm-backend all") beside the torch BF16 baselines
# measured in the same call (bench/torch_linear_baseline.py's matmul, bench/torch_moe_baseline.py's
# grouped_mm; TORCH=0 skips them). With BASELINE=1 (build-base/ carried) the baseline build's rows
# follow this build's, and VARIANTS ("VAR=1,VAR2=x" settings) repeat this build's under each.
OPS=${OPS:-dense,moe}
M=${M:-1,2,4,8,16,64,128,8192}
MOE_TOKENS=${MOE_TOKENS:-1,4,16,64,128,512,2048,8192}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cat "$OUT/gpu.txt"
rows() {  # rows TAG BIN [NAME=VALUE...]
  local tag=$1 bin=$2; shift 2
  # shellcheck disable=SC2086
  env "$@" timeout 300 "$bin" bench kernels --ops "$OPS" --m "$M" --moe-tokens "$MOE_TOKENS" ${EXTRA:-} \
    --json "$OUT/kernels_$tag.json" > "$OUT/kernels_$tag.txt" 2>&1
  echo "== bench kernels: $tag (rc $?)"
  cat "$OUT/kernels_$tag.txt"
}
rows this build-device/nibble
for v in ${VARIANTS:-}; do [ "$v" = base ] || rows "$(printf '%s' "$v" | tr '=,' '-_')" build-device/nibble ${v//,/ }; done
if [ "${BASELINE:-0}" = 1 ]; then unpack_baseline; rows baseline build-base/nibble; fi
if [ "${TORCH:-1}" = 1 ]; then
  case "$OPS" in *dense*) python3 bench/torch_linear_baseline.py --m "$M" > "$OUT/torch.txt" 2>&1 ;; esac
  case "$OPS" in *moe*) python3 bench/torch_moe_baseline.py --tokens "$MOE_TOKENS" > "$OUT/torch_moe.txt" 2>&1 ;; esac
  cat "$OUT"/torch*.txt
fi
