"""Measures how far the W4A4 activation modes move a model's logits from W4A16 (mode none), on the
tiny random test models of tests/python (the numbers in docs/numerics.md).
Usage: .venv/bin/python scripts/measure_numerics.py [--seed N]"""
import argparse
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests/python"))
import qwen3_reference  # noqa: E402
from test_reference_vs_transformers import PROMPT, SHAPES  # noqa: E402


def logits(model_dir, ids, moe, dense):
    with tempfile.TemporaryDirectory() as tmp:
        dump = pathlib.Path(tmp) / "l.npy"
        subprocess.run([str(REPO / "build/nibble"), "generate", "--model", str(model_dir), "--prompt-ids",
                        ",".join(map(str, ids)), "--max-tokens", "1", "--dump-logits", str(dump),
                        "--act-quant-moe", moe, "--act-quant-dense", dense], check=True, capture_output=True)
        return np.load(dump)[0]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print("| model | modes (moe/dense) | mean rel. logit diff vs none | max | top-1 agreement |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, shape in SHAPES.items():
            ckpt = pathlib.Path(tmp) / name
            qwen3_reference.build(shape, args.seed, ckpt)
            prefixes = [PROMPT[:n] + [(7 * n) % 500 for n in range(k)] for n in (4, 8, 12) for k in (0, 5, 10)]
            base = [logits(ckpt, p, "none", "none") for p in prefixes]
            for moe, dense in (("static", "static"), ("per-token", "per-token"), ("per-token", "none")):
                diffs, agree = [], 0
                for p, b in zip(prefixes, base):
                    q = logits(ckpt, p, moe, dense)
                    diffs.append(np.abs(q - b).max() / np.abs(b).max())
                    agree += int(q.argmax() == b.argmax())
                print(f"| {name} | {moe}/{dense} | {np.mean(diffs):.3f} | {np.max(diffs):.3f} | "
                      f"{agree}/{len(prefixes)} |")


if __name__ == "__main__":
    main()
