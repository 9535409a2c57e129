"""torch BF16 baseline for the MoE rows of `nibble bench kernels`: Qwen3-30B-A3B's expert GEMMs
(E=128, k=8, H=2048, I=768) as torch._grouped_mm on tokens already sorted by expert — gate_up
[P, H]·[E, H, 2I] then down [P, I]·[E, I, H] — the "grouped_mm GEMMs alone" baseline of issue 8, and
the same plus routing, sorting, SwiGLU and the weighted combine ("torch MoE"). Timed like nibble:
CUDA events over a CUDA graph of launches, weights in two copies and eight routings (beyond L2),
median. Run on the device machine (`scripts/device.sh kernels`)."""
import argparse

import torch

from torch_timing import time_launches  # bench/, the script's own folder

E, K, H, I = 128, 8, 2048, 768


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="1,128,8192")
    args = parser.parse_args()
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print(f"{'op':<22} {'T':>6} {'time (us)':>10} {'TFLOP/s':>9}")
    dev = "cuda"
    # [E, N, K] row-major weights viewed as [E, K, N] (K contiguous), as _grouped_mm wants mat_b.
    w13 = [(torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16) * 0.02).transpose(-2, -1) for _ in range(2)]
    w2 = [(torch.randn(E, H, I, device=dev, dtype=torch.bfloat16) * 0.02).transpose(-2, -1) for _ in range(2)]
    router = torch.randn(E, H, device=dev, dtype=torch.bfloat16) * 0.02
    for t in [int(v) for v in args.tokens.split(",")]:
        xs = [torch.randn(t, H, device=dev, dtype=torch.bfloat16) for _ in range(8)]
        sorted_inputs = []
        for x in xs:
            ids = torch.topk(torch.softmax((x @ router.t()).float(), -1), K, dim=-1).indices.flatten()
            counts = torch.bincount(ids, minlength=E)
            offs = torch.cumsum(counts, 0).to(torch.int32)
            order = torch.argsort(ids, stable=True)
            sorted_inputs.append((x[order // K].contiguous(), offs))
        act = torch.randn(t * K, I, device=dev, dtype=torch.bfloat16)
        flops = 2 * t * K * 3 * H * I

        def gemms(c):
            xs_sorted, offs = sorted_inputs[c]
            torch._grouped_mm(xs_sorted, w13[c % 2], offs=offs)
            torch._grouped_mm(act, w2[c % 2], offs=offs)

        sec = time_launches(gemms, 8)
        print(f"{'grouped_mm GEMMs':<22} {t:>6} {sec * 1e6:>10.2f} {flops / sec / 1e12:>9.1f}")

        def full(c):
            x = xs[c]
            probs = torch.softmax((x @ router.t()).float(), -1)
            weights, ids = torch.topk(probs, K, dim=-1)
            weights = weights / weights.sum(-1, keepdim=True)
            flat = ids.flatten()
            order = torch.argsort(flat, stable=True)
            counts = torch.zeros(E, device=dev, dtype=torch.int32).scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
            offs = torch.cumsum(counts, 0, dtype=torch.int32)
            gate_up = torch._grouped_mm(x[order // K], w13[c % 2], offs=offs)
            h = torch.nn.functional.silu(gate_up[:, :I]) * gate_up[:, I:]
            y = torch._grouped_mm(h, w2[c % 2], offs=offs)
            out = torch.zeros(t * K, H, device=dev, dtype=torch.float32)
            out[order] = y.float()
            return (out.view(t, K, H) * weights.unsqueeze(-1)).sum(1)

        sec = time_launches(full, 8)
        print(f"{'torch MoE (bf16)':<22} {t:>6} {sec * 1e6:>10.2f} {flops / sec / 1e12:>9.1f}")


if __name__ == "__main__":
    main()
