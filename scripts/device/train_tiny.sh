# `scripts/device.sh train-tiny`: trains the small default model (scripts/train_tiny_moe.py), then measures
# GSM8K-like 8-shot accuracy through `nibble serve` + `nibble eval gsm8k` on held-apart problems in every
# NVFP4 numerics mode on the GPU. Logs, the NVFP4 checkpoint (tiny-nvfp4.tar.gz) and the BF16 one (in
# 15 MB parts, for the BF16 row measured on a CPU) come back under $OUT. TRAIN_ARGS goes to the trainer;
# MODEL=DIR skips training and measures that NVFP4 checkpoint (e.g. data/default-model).
export PYTHONUNBUFFERED=1
T=/tmp/tiny   # outside $OUT: only the files listed below come back
QUESTIONS=${QUESTIONS:-1319}   # the size of GSM8K's test split
if [ -z "${MODEL:-}" ]; then
  python3 scripts/train_tiny_moe.py --out "$T" --nibble build-device/nibble ${TRAIN_ARGS:-} 2>&1 | tee "$OUT/train.log" |
    grep -v "^step [1-9][0-9]*[1-9]00:" || { echo "training failed"; exit 1; }
  tar -C "$T" -czf "$OUT/tiny-nvfp4.tar.gz" nvfp4
  tar -C "$T" -czf "$OUT/tiny-bf16-meta.tar.gz" --exclude model.safetensors bf16
  split -b 15M "$T/bf16/model.safetensors" "$OUT/tiny-bf16-safetensors.part-"
  MODEL=$T/nvfp4
fi
mkdir -p "$T"
build-device/nibble eval make-gsm8k-like --out "$T/heldout.jsonl" --n "$QUESTIONS" --seed 1000 > /dev/null

# eval_mode NAME PORT SERVE_ARGS...: serve, wait until it answers, ask every question, stop it.
eval_mode() {
  local name=$1 port=$2; shift 2
  build-device/nibble serve --port "$port" "$@" > "$OUT/serve-$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 120); do curl -sf "localhost:$port/health" > /dev/null && break; sleep 1; done
  timeout "${EVAL_TIMEOUT:-120}" build-device/nibble eval gsm8k --data "$T/heldout.jsonl" --num-questions "$QUESTIONS" --parallel "${PARALLEL:-512}" \
    --port "$port" --predictions "$OUT/pred-$name.jsonl" > "$OUT/eval-$name.txt" 2>&1
  kill "$pid"; wait "$pid" 2> /dev/null
  echo "$name: $(tr '\n' ' ' < "$OUT/eval-$name.txt")"
}
# The modes of docs/numerics.md's accuracy study; per-token-moe-static-dense is SGLang's per-token PR
# (the MoE's activations scaled per token, the dense layers' by the checkpoint's static input_scale).
eval_mode w4a16 8302 --model "$MODEL" --backend cuda
eval_mode static-w4a4 8302 --model "$MODEL" --backend cuda --act-quant-moe static --act-quant-dense static
eval_mode per-token-moe-static-dense 8302 --model "$MODEL" --backend cuda --act-quant-moe per-token --act-quant-dense static
eval_mode per-token-moe 8302 --model "$MODEL" --backend cuda --act-quant-moe per-token
eval_mode per-token-all 8302 --model "$MODEL" --backend cuda --act-quant-moe per-token --act-quant-dense per-token
[ -f "$OUT/train.log" ] && grep -E "^(corpus|model|probe):|loss" "$OUT/train.log" | tail -4
