"""Trains nibble's small default model (issue 18): a Qwen3-MoE of Qwen3-30B-A3B's architecture at a
few MB, on `nibble eval make-gsm8k-like` problems written as SGLang's few-shot GSM8K prompts
("Question: q\\nAnswer: a\\n\\n" blocks) and, a quarter of them, as ChatML turns, with a byte-level
BPE trained on that corpus by the `tokenizers` library. Deterministic given --seed (bit for bit on
the CPU; on the GPU cuDNN's attention backward is not, so weights differ in their last bits). Writes
OUT/bf16 (a Hugging Face checkpoint with its tokenizer) and OUT/nvfp4 (`nibble quantize` of it,
calibrated on the training text).

    python3 scripts/train_tiny_moe.py --out /tmp/tiny-moe --nibble build/nibble [--steps N]

Runs on the GPU machine in minutes at the default sizes; tiny sizes run on a CPU (the CI smoke test).
`--steps auto` times the first steps and picks the step count that fits --time-budget; it prints the
count, and passing it as --steps reproduces the run exactly.
"""
import argparse
import json
import math
import pathlib
import random
import subprocess
import time

import numpy as np
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML, as Qwen's: a chat request renders to the same kind of text the model was trained on.
CHAT_TEMPLATE = ("{%- for message in messages %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
                 "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")


def args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--nibble", default="build/nibble", help="the nibble binary (make-gsm8k-like, quantize)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--problems", type=int, default=400000, help="training problems (make-gsm8k-like --n)")
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--moe-intermediate", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per training sequence (8-shot prompts fit)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", default="auto", help="optimizer steps, or auto (fit --time-budget)")
    p.add_argument("--time-budget", type=float, default=360.0, help="seconds of training for --steps auto")
    p.add_argument("--lr", type=float, default=2e-3)
    return p


def corpus(nibble: str, n: int, seed: int, path: pathlib.Path) -> list[dict]:
    subprocess.run([nibble, "eval", "make-gsm8k-like", "--out", str(path), "--n", str(n), "--seed", str(seed)],
                   check=True, capture_output=True)
    return [json.loads(line) for line in path.read_text().splitlines()]


def block(item: dict) -> str:  # one few-shot example, as tools/bench/gsm8k.cpp (SGLang's get_one_example) writes it
    return f"Question: {item['question']}\nAnswer: {item['answer']}\n\n"


def chat_block(item: dict) -> str:  # the same problem as a conversation rendered by CHAT_TEMPLATE
    return f"<|im_start|>user\n{item['question']}<|im_end|>\n<|im_start|>assistant\n{item['answer']}<|im_end|>\n"


def render(items: list[dict], rng: random.Random, segment: int = 64, chat_share: float = 0.25) -> list[str]:
    """The corpus in runs of `segment` problems, each run few-shot text or (chat_share of them) chat
    turns: a window of 8-shot length rarely crosses formats, so greedy few-shot answers go on with
    "Question" and chat answers end with <|im_end|>, and the default server answers both ways."""
    texts = []
    for start in range(0, len(items), segment):
        write = chat_block if rng.random() < chat_share else block
        texts.extend(write(item) for item in items[start:start + segment])
    return texts


def train_tokenizer(texts: list[str], vocab: int, out: pathlib.Path) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    # Digits one by one (as Qwen's pre-tokenizer splits them): arithmetic sees every digit.
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "bos_token": None, "add_bos_token": False, "chat_template": CHAT_TEMPLATE,
        "model_max_length": 4096}, indent=2))
    return tok


def batches(ids: np.ndarray, starts: np.ndarray, seq_len: int, batch: int, rng: np.random.Generator):
    """Windows of the token stream that begin at a problem's first token, as an 8-shot prompt begins
    (position 0 is always "Question"); a window runs on through the following problems."""
    starts = starts[starts + seq_len <= len(ids)]
    offsets = np.arange(seq_len)
    while True:
        rows = rng.choice(starts, size=batch)
        yield torch.from_numpy(ids[rows[:, None] + offsets[None, :]].astype(np.int64))


def nvfp4_megabytes(c: Qwen3MoeConfig) -> float:
    """The quantized checkpoint's size: linear weights at 4.5 bits (E2M1 codes + one E4M3 scale per 16),
    the tied embedding, norms and routers in BF16."""
    attn = c.hidden_size * c.head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    experts = c.num_experts * 3 * c.hidden_size * c.moe_intermediate_size
    bf16 = c.vocab_size * c.hidden_size + c.num_hidden_layers * (c.num_experts * c.hidden_size + 4 * c.hidden_size)
    return (c.num_hidden_layers * (attn + experts) * 4.5 / 8 + 2 * bf16) / 1e6


def main() -> None:
    a = args_parser().parse_args()
    random.seed(a.seed)
    torch.manual_seed(a.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    out = a.out
    bf16_dir = out / "bf16"
    bf16_dir.mkdir(parents=True, exist_ok=True)
    items = corpus(a.nibble, a.problems, a.seed, out / "train.jsonl")
    texts = render(items, random.Random(a.seed))
    tok = train_tokenizer(texts, a.vocab, bf16_dir)
    eot = tok.token_to_id("<|endoftext|>")
    encoded = [np.asarray(enc.ids, dtype=np.int32) for enc in tok.encode_batch(texts)]
    starts = np.cumsum([0] + [len(e) for e in encoded[:-1]])
    ids = np.concatenate(encoded)
    print(f"corpus: {len(items)} problems, {len(ids)} tokens, vocabulary {tok.get_vocab_size()}", flush=True)

    config = Qwen3MoeConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=a.hidden, intermediate_size=a.moe_intermediate * a.top_k,
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
        num_experts=a.experts, num_experts_per_tok=a.top_k, moe_intermediate_size=a.moe_intermediate,
        decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, max_position_embeddings=4096,
        rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, output_router_logits=True,
        router_aux_loss_coef=0.01, bos_token_id=None, eos_token_id=tok.token_to_id("<|im_end|>"), pad_token_id=eot)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # On the GPU, transformers' grouped-GEMM experts (one torch._grouped_mm per projection) where it has
    # them; the per-expert loop otherwise. The math is the same; only the speed differs.
    try:
        model = Qwen3MoeForCausalLM._from_config(config, experts_implementation="grouped_mm" if device == "cuda" else "eager")
    except (TypeError, ValueError, KeyError):
        model = Qwen3MoeForCausalLM(config)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, NVFP4 checkpoint "
          f"~{nvfp4_megabytes(config):.1f} MB, experts {getattr(model.config, '_experts_implementation', 'eager')}",
          flush=True)
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    data = batches(ids, starts, a.seq_len, a.batch, np.random.default_rng(a.seed))

    def step_fn(x: torch.Tensor) -> float:
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    # Warm-up at a constant small learning rate; with --steps auto it also times the steps.
    probe = 20
    for group in opt.param_groups:
        group["lr"] = a.lr / 20
    t0 = time.perf_counter()
    for step in range(probe):
        loss = step_fn(next(data).to(device))
        if step == 0:
            print(f"warm-up step 0: loss {loss:.4f}", flush=True)
        if step == 4:
            t0 = time.perf_counter()
    per_step = (time.perf_counter() - t0) / (probe - 5)
    steps = int(a.steps) if a.steps != "auto" else max(100, int(a.time_budget / per_step) // 100 * 100)
    print(f"probe: {per_step * 1e3:.1f} ms per step ({a.batch * a.seq_len / per_step / 1e3:.0f} k tokens/s); "
          f"training {steps} steps (--steps {steps} reproduces this run)", flush=True)
    for group in opt.param_groups:
        group["lr"] = a.lr
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    for step in range(steps):
        loss = step_fn(next(data).to(device))
        sched.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step}: loss {loss:.4f}", flush=True)

    model.config.output_router_logits = False
    model.to(torch.bfloat16).save_pretrained(bf16_dir, safe_serialization=True)
    (bf16_dir / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [config.eos_token_id, eot], "pad_token_id": eot, "do_sample": False}, indent=2))
    calib = out / "calib.txt"
    calib.write_text("".join(texts[::max(1, len(texts) // 512)][:512]))  # both formats
    subprocess.run([a.nibble, "quantize", "--in", str(bf16_dir), "--out", str(out / "nvfp4"), "--calib", str(calib)],
                   check=True)
    print(f"wrote {bf16_dir} and {out / 'nvfp4'}")


if __name__ == "__main__":
    main()
