"""torch BF16 baseline for `nibble bench kernels`: torch.matmul on the same dense shapes and M,
timed the same way (CUDA events over a CUDA graph of launches, weights rotated beyond L2, median).
Run on the device machine beside `nibble bench kernels` (`scripts/device.sh kernels`)."""
import argparse

import torch

from torch_timing import time_launches  # bench/, the script's own folder

SHAPES = [("q_proj", 4096, 2048), ("k_proj", 512, 2048), ("o_proj", 2048, 4096),
          ("expert.gate", 768, 2048), ("expert.down", 2048, 768)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--m", default="1,8,16,128,1024,8192")
    args = parser.parse_args()
    ms = [int(m) for m in args.m.split(",")]
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print(f"{'op':<12} {'M':>6} {'torch bf16 (us)':>16} {'TFLOP/s':>9}")
    for name, n, k in SHAPES:
        copies = max(2, (120 << 20) // (n * k * 2) + 1)
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x_all = torch.randn(max(ms), k, device="cuda", dtype=torch.bfloat16)
        for m in ms:
            x = x_all[:m]
            t = time_launches(lambda c: torch.matmul(x, weights[c].t()), copies)
            print(f"{name:<12} {m:>6} {t * 1e6:>16.2f} {2 * m * n * k / t / 1e12:>9.1f}")


if __name__ == "__main__":
    main()
