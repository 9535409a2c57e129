"""torch BF16 baseline for `nibble bench kernels`: torch.matmul on the same dense shapes and M,
timed the same way (CUDA events over a CUDA graph of launches, weights rotated beyond L2, median).
Run on the device machine beside `nibble bench kernels` (scripts/device_kernels.sh)."""
import argparse
import statistics

import torch

SHAPES = [("q_proj", 4096, 2048), ("k_proj", 512, 2048), ("o_proj", 2048, 4096),
          ("expert.gate", 768, 2048), ("expert.down", 2048, 768)]


def time_launches(launch, copies, iterations=20, batches=15):
    """Median seconds per launch; the launches of a batch run as one CUDA graph (as nibble times them)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for c in range(copies):
            launch(c)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(iterations):
            launch(i % copies)
    graph.replay()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    results = []
    for _ in range(batches):
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        results.append(start.elapsed_time(stop) * 1e-3 / iterations)
    return statistics.median(results)


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
