"""torch baseline for long-context prefill attention: one layer of Qwen3-30B-A3B's causal attention
(32 query heads, 4 KV heads, head dim 128, BF16) over one T-token prompt, by each of torch's SDPA
backends that takes the shape (FlashAttention-2, cuDNN, memory-efficient), timed with CUDA events
(median of a few calls; a call at 128k runs ~10 ms, so launch overhead is nothing). Prints time per
layer, the model's 48 layers, and TFLOP/s counting the causal half (4·T²/2·d·H). Run on the device
machine (`scripts/device.sh long-context`)."""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HKV, D, LAYERS = 32, 4, 128, 48


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="32768,131072")
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print(f"{'backend':<12} {'T':>7} {'ms/layer':>9} {'ms/48 layers':>13} {'TFLOP/s':>8}")
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    for t in [int(v) for v in args.tokens.split(",")]:
        q = torch.randn(1, HQ, t, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, HKV, t, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, HKV, t, D, device="cuda", dtype=torch.bfloat16)
        flops = 4 * t * t / 2 * D * HQ
        for name, backend in backends:
            # GQA by enable_gqa where the backend takes it, else the KV heads repeated (same FLOPs).
            for gqa in (True, False):
                kk, vv = (k, v) if gqa else (k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1))
                try:
                    with sdpa_kernel(backend):
                        call = lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa)
                        call()
                        torch.cuda.synchronize()
                        times = []
                        for _ in range(args.calls):
                            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                            start.record()
                            call()
                            stop.record()
                            stop.synchronize()
                            times.append(start.elapsed_time(stop) * 1e-3)
                except RuntimeError as e:  # the backend does not take this shape or this GPU
                    if not gqa:
                        print(f"{name:<12} {t:>7} unavailable: {str(e).splitlines()[0][:80]}")
                    continue
                s = statistics.median(times)
                label = name + ("" if gqa else "+rep")
                print(f"{label:<12} {t:>7} {s * 1e3:>9.2f} {s * 1e3 * LAYERS:>13.1f} {flops / s / 1e12:>8.1f}")
                break
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
