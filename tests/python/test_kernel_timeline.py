"""scripts/kernel_timeline.py on synthetic NIBBLE_DIAG_KERNEL_TRACE files whose answers are known: steps cut at
the embedding kernels and named by the labels in order, the warm-up step left out, exposed times and
gaps adding up to each step's time with PDL-style overlaps (a kernel starting before its predecessor
ends), and the one-layer timeline found from the repeating kernels (one of them run twice a layer)."""
import csv
import gzip
import random
import re
import subprocess
import sys

from conftest import REPO

# A layer's kernels; the MoE GEMM twice (gate_up and down: one key counted twice a layer).
LAYER = [("add_rmsnorm", 64), ("skinny_gemm", 256), ("attention", 128), ("moe", 512), ("moe", 512)]


def write_trace(path, rng, n_steps, n_layers):
    """A trace of n_steps identical-shaped steps; returns each step's (time, sum of gaps) in ns."""
    rows, truth, t = [], [], 1_000
    for step in range(n_steps):
        t += rng.randrange(2_000, 9_000)  # idle before the step
        first, frontier, gaps = t, t, 0
        kernels = [("embedding_kernel", 8)] + LAYER * n_layers + [("sampler", 4)]
        for name, grid in kernels:
            if name == "embedding_kernel":  # a step starts where its first kernel does
                start = t
            elif rng.random() < 0.5:  # launched early (PDL): before the frontier, after its predecessor's start
                start = max(start + 1, frontier - rng.randrange(1, 3_000))
            else:  # a launch gap
                start = frontier + rng.randrange(0, 4_000)
                gaps += start - frontier
            end = max(start, frontier) + rng.randrange(500, 20_000)
            rows.append(["kernel", name, start, end, 7, 1, 0, step, grid, 128, 0, 0])
            frontier = max(frontier, end)
        truth.append((frontier - first, gaps))
        t = frontier
    rng.shuffle(rows)  # the file's order is not the launch order
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kind", "name", "start_ns", "end_ns", "stream", "graph", "node", "correlation", "grid", "block", "smem", "bytes"])
        for i in range(n_steps):
            w.writerow(["label", "decode graph of 64 (64 sequences)" if i else "warm-up", i] + [""] * 9)
        w.writerows(rows)
    return truth


def test_steps_exposed_times_and_gaps_add_up(tmp_path, seed):
    rng = random.Random(seed)
    n_steps, n_layers = rng.randrange(3, 7), rng.randrange(4, 12)
    truth = write_trace(tmp_path / "trace.csv", rng, n_steps, n_layers)
    out = subprocess.run([sys.executable, str(REPO / "scripts/kernel_timeline.py"), str(tmp_path / "trace.csv")],
                         capture_output=True, text=True, check=True).stdout
    # The warm-up label is one step (kept: it is alone); the others average steps 2..n after leaving out step 1.
    head = re.search(r"## decode graph of 64 \(64 sequences\): (\d+) steps, ([\d.]+) us a step", out)
    assert head, out
    timed = truth[2:]  # steps 1..n-1 carry the label; the first of them is the warm-up left out
    assert int(head.group(1)) == len(timed)
    mean_us = sum(t for t, _ in timed) / len(timed) / 1e3
    assert abs(float(head.group(2)) - mean_us) < 0.051, (head.group(2), mean_us)  # printed to 0.1 us
    section = out.split("## decode graph of 64")[1]
    exposed = sum(float(m) for m in re.findall(r"^\| \w+ \| \d+ x \d+ \| \d+ \| [\d.]+ \| ([\d.]+) \|", section, re.M))
    gaps = float(re.search(r"gaps \(nothing started\) ([\d.]+) us", section).group(1))
    mean_gaps_us = sum(g for _, g in timed) / len(timed) / 1e3
    assert abs(gaps - mean_gaps_us) < 0.051
    # Exposed time and gaps make up the step; each printed to 0.1 us (7 rows).
    assert abs(exposed + gaps - mean_us) < 0.5, (exposed, gaps, mean_us)
    # Every layer kernel runs n_layers times a step; the middle layer's timeline lists the layer's kernels in order.
    for name, grid in set(LAYER):
        per_step = LAYER.count((name, grid)) * n_layers
        assert re.search(rf"^\| {name} \| {grid} x 128 \| {per_step} \|", section, re.M), name
    layer = re.search(rf"layer (\d+) of {n_layers} in the median step", section)
    assert layer, section
    listed = re.findall(r"^\| (\w+) \| \d+ x 128 \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$", section.split("layer ")[-1], re.M)
    assert listed == [name for name, _ in LAYER]
    # A gzipped trace (as `scripts/device.sh timeline` leaves it) reads the same.
    with open(tmp_path / "trace.csv", "rb") as raw, gzip.open(tmp_path / "trace.csv.gz", "wb") as packed:
        packed.write(raw.read())
    again = subprocess.run([sys.executable, str(REPO / "scripts/kernel_timeline.py"), str(tmp_path / "trace.csv.gz")],
                           capture_output=True, text=True, check=True).stdout
    assert again.split("\n", 1)[1] == out.split("\n", 1)[1]  # all but the first line, which names the file
