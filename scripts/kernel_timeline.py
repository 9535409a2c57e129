#!/usr/bin/env python3
"""Summarizes a NIBBLE_DIAG_KERNEL_TRACE file (src/cuda/diagnostics/kernel_trace.h): the trace is cut into steps at
each embedding kernel, each step takes its label (in order), and the steps of one label are averaged
(the first left out as a warm-up when there are more). For each kernel, in launch order within the
step: its duration and its *exposed* time — how far its end moved the step's frontier (the latest end
so far) — and any *gap*, the time the GPU had nothing started before it. A kernel launched early by
programmatic dependent launch starts before the frontier, so its waiting shows in its duration, not
in the step: exposed times and gaps add up to the step's time. Prints one table per label, by kernel,
and the timeline of one middle layer."""
import argparse
import csv
import gzip
import statistics
from collections import defaultdict


def load(path):
    labels, kernels = [], []
    # `scripts/device.sh timeline` leaves its traces gzipped.
    opened = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    for r in csv.DictReader(opened):
        if r["kind"] == "label":
            labels.append(r["name"])
        elif r["kind"] == "kernel":
            kernels.append((r["name"], int(r["start_ns"]), int(r["end_ns"]), r["grid"], r["block"], r["stream"]))
    kernels.sort(key=lambda k: k[1])
    return labels, kernels


def split_steps(labels, kernels):
    starts = [i for i, k in enumerate(kernels) if k[0].startswith("embedding")]
    steps = []
    for n, i in enumerate(starts):
        j = starts[n + 1] if n + 1 < len(starts) else len(kernels)
        steps.append((labels[n] if n < len(labels) else "(unlabelled)", kernels[i:j]))
    return steps


def timeline(step):
    """Per kernel: (key, start offset, duration, exposed, gap), all µs, in start order."""
    out, frontier = [], step[0][1]
    t0 = frontier
    for name, start, end, grid, block, stream in step:
        gap = max(0, start - frontier)
        exposed = max(0, end - max(frontier, start))
        frontier = max(frontier, end)
        out.append(((name, grid, block), (start - t0) / 1e3, (end - start) / 1e3, exposed / 1e3, gap / 1e3))
    return out, (frontier - t0) / 1e3


def layer_bounds(rows):
    """Index ranges of the repeating layers: the layer count is the commonest count of a kernel key
    (a kernel run twice a layer, or once more in the step, counts otherwise), the anchor the earliest
    key with that count."""
    counts = defaultdict(int)
    for r in rows:
        counts[r[0]] += 1
    how_often = defaultdict(int)
    for c in counts.values():
        if c > 1:
            how_often[c] += 1
    if not how_often:
        return [], 0
    per_layer = max(how_often, key=lambda c: (how_often[c], c))
    anchor = next(r[0] for r in rows if counts[r[0]] == per_layer)
    idx = [i for i, r in enumerate(rows) if r[0] == anchor]
    return [(a, b) for a, b in zip(idx, idx[1:])], per_layer


def report(label, steps, show_layer):
    if len(steps) > 1:
        steps = steps[1:]
    lines = [timeline(s) for s in steps]
    step_us = [t for _, t in lines]
    print(f"\n## {label}: {len(steps)} steps, {statistics.mean(step_us):.1f} us a step (median {statistics.median(step_us):.1f})")
    per_key = defaultdict(lambda: [0, 0.0, 0.0, 0.0])  # count, duration, exposed, gap (sums over steps)
    for rows, _ in lines:
        for key, _, dur, exp, gap in rows:
            acc = per_key[key]
            acc[0] += 1
            acc[1] += dur
            acc[2] += exp
            acc[3] += gap
    n = len(lines)
    total = statistics.mean(step_us)
    print("| kernel | grid x block | a step | us each | exposed us a step | share | gaps us a step |")
    print("|---|---|---|---|---|---|---|")
    for key, (c, dur, exp, gap) in sorted(per_key.items(), key=lambda kv: -kv[1][2]):
        print(f"| {key[0]} | {key[1]} x {key[2]} | {c / n:.0f} | {dur / c:.2f} | {exp / n:.1f} | {100 * exp / n / total:.1f}% | {gap / n:.1f} |")
    gaps = sum(sum(r[4] for r in rows) for rows, _ in lines) / n
    print(f"gaps (nothing started) {gaps:.1f} us a step ({100 * gaps / total:.1f}%)")
    if not show_layer:
        return
    median = sorted(lines, key=lambda l: l[1])[len(lines) // 2][0]
    bounds, n_layers = layer_bounds(median)
    if not bounds:
        return
    a, b = bounds[len(bounds) // 2]
    base = median[a][1]
    print(f"\nlayer {len(bounds) // 2} of {n_layers} in the median step ({median[b][1] - base:.1f} us):")
    print("| kernel | grid x block | starts at | duration | exposed | gap |")
    print("|---|---|---|---|---|---|")
    for key, start, dur, exp, gap in median[a:b]:
        print(f"| {key[0]} | {key[1]} x {key[2]} | {start - base:.1f} | {dur:.1f} | {exp:.1f} | {gap:.1f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--labels", help="only labels containing this text")
    ap.add_argument("--no-layer", action="store_true", help="leave out the one-layer timeline")
    args = ap.parse_args()
    labels, kernels = load(args.trace)
    by_label = defaultdict(list)
    for label, step in split_steps(labels, kernels):
        if not args.labels or args.labels in label:
            by_label[label].append(step)
    print(f"{args.trace}: {len(kernels)} kernels, {sum(len(v) for v in by_label.values())} steps, {len(by_label)} kinds")
    for label, steps in by_label.items():
        report(label, steps, not args.no_layer)


if __name__ == "__main__":
    main()
