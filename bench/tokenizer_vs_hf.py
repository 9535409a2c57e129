"""Encode throughput of nibble's tokenizer and Hugging Face tokenizers' Rust encoder, both on one
thread, on the same ≥ 10 MB of mixed text (tests/python/tokenizer_corpus.py documents).
Usage: .venv/bin/python bench/tokenizer_vs_hf.py [--mb 10] [--seed 0]"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests/python"))
os.environ["RAYON_NUM_THREADS"] = "1"        # the HF encoder's thread pool: one thread
os.environ["TOKENIZERS_PARALLELISM"] = "false"
import tokenizer_corpus  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    base = tokenizer_corpus.corpus(args.seed, 20000)
    docs, size, i = [], 0, 0
    while size < args.mb * 1e6:  # documents of ~20 corpus strings each
        doc = "\n".join(base[(i + k) % len(base)] for k in range(20))
        docs.append(doc)
        size += len(doc.encode())
        i += 7
    tokenizer = REPO / "data/qwen3-tokenizer/tokenizer.json"
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for d in docs:
            f.write(json.dumps(d) + "\n")
    out = subprocess.run([str(REPO / "build/bench/bench_tokenizer"), str(tokenizer), f.name, "3"],
                         capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    hf = Tokenizer.from_file(str(tokenizer))
    best = 1e30
    for r in range(3):
        start = time.perf_counter()
        n = sum(len(e.ids) for e in hf.encode_batch(docs, add_special_tokens=False))
        elapsed = time.perf_counter() - start
        if r == 0:
            print(f"hf cold: {size / 1e6 / elapsed:.2f} MB/s")
        best = min(best, elapsed)
    print(out.strip())
    print(f"hf tokenizers: {size / 1e6:.2f} MB in {len(docs)} docs, {n} tokens, best {best:.3f} s, "
          f"{size / 1e6 / best:.2f} MB/s")


if __name__ == "__main__":
    main()
