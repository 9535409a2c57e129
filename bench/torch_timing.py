"""CUDA timing shared by the torch baselines, the way `nibble bench kernels` times: every copy once
as warm-up, then the median over batches of one CUDA graph of `iterations` launches, per launch."""
import statistics

import torch


def time_launches(launch, copies, iterations=20, batches=15):
    """Median seconds per launch of launch(copy), copies rotated."""
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
