"""scripts/train_tiny_moe.py (issue 18) at toy sizes on the CPU: the loss falls, the run is
deterministic given its seed, and its outputs are what nibble serves — a tokenizer nibble encodes
exactly as `tokenizers` does, a BF16 checkpoint that `nibble quantize` turns into a ModelOpt NVFP4
one with no problems, which `nibble generate` runs."""
import hashlib
import json
import re
import subprocess
import sys

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

from test_checkpoints import REPO, nibble

TOY = ["--problems", "300", "--vocab", "600", "--hidden", "128", "--layers", "2", "--heads", "2", "--kv-heads", "1",
       "--head-dim", "64", "--experts", "4", "--top-k", "2", "--moe-intermediate", "128", "--seq-len", "128",
       "--batch", "4", "--steps", "30", "--lr", "1e-2"]


def train(build_dir, out, seed):
    r = subprocess.run([sys.executable, str(REPO / "scripts/train_tiny_moe.py"), "--out", str(out), "--nibble",
                        str(build_dir / "nibble"), "--seed", str(seed), *TOY], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return [float(x) for x in re.findall(r"step \d+: loss ([0-9.]+)", r.stdout)]


def test_train_tiny_moe_end_to_end(build_dir, tmp_path, seed):
    losses = train(build_dir, tmp_path / "a", seed)
    assert len(losses) >= 2 and losses[-1] < losses[0] - 1.0, losses  # it learns the format
    again = train(build_dir, tmp_path / "b", seed)
    assert again == losses
    digest = [hashlib.sha256((tmp_path / d / "bf16" / "model.safetensors").read_bytes()).hexdigest() for d in "ab"]
    assert digest[0] == digest[1], "the same seed gives the same weights"

    nvfp4 = tmp_path / "a" / "nvfp4"
    report = json.loads(nibble(build_dir, "inspect", nvfp4, "--json").stdout)
    assert report["problems"] == []
    text = "Question: Natalia had 48 apples. She bought 27 more.\nAnswer: 48 + 27 = <<48+27=75>>75\n#### 75"
    want = Tokenizer.from_file(str(nvfp4 / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    got = json.loads(nibble(build_dir, "tokenize", "--model", nvfp4, "--text", text).stdout)
    assert got == want and max(want) < 600
    gen = nibble(build_dir, "generate", "--model", nvfp4, "--prompt", "Question: What is 2 + 3?\nAnswer:",
                 "--max-tokens", "4", "--temperature", "0")
    assert "decode" in gen.stderr


def test_nibble_reads_the_trained_checkpoint_as_transformers_does(build_dir, tmp_path, seed):
    """The trained BF16 checkpoint (tied embeddings, its own head shapes): nibble's CPU forward gives
    transformers' next-token logits (fp32 math on the same BF16 weights: ~1e-5 apart; 1e-3 of the
    largest logit allows a different summation order, not a wrong weight)."""
    train(build_dir, tmp_path / "m", seed)
    bf16 = tmp_path / "m" / "bf16"
    prompt = Tokenizer.from_file(str(bf16 / "tokenizer.json")).encode("Question: Liam has 12 apples.\nAnswer:").ids
    dump = tmp_path / "logits.npy"
    r = subprocess.run([str(build_dir / "nibble"), "generate", "--model", str(bf16), "--backend", "cpu",
                        "--prompt-ids", ",".join(map(str, prompt)), "--max-tokens", "1", "--ignore-eos",
                        "--dump-logits", str(dump)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    model = AutoModelForCausalLM.from_pretrained(str(bf16), dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(torch.tensor([prompt])).logits[0, -1]
    got = torch.from_numpy(np.load(dump))[0]
    assert got.shape == want.shape
    assert (got - want).abs().max() <= 1e-3 * want.abs().max(), (got - want).abs().max()
