#!/usr/bin/env python3
"""Summarizes `nibble serve --step-log` CSV: steps grouped by their prefill tokens, with each group's
count, mean tokens and device time, its share of the run's device time, and its cost per token. Rows
without a device time (the CPU runner's) are left out."""
import csv
import sys

EDGES = [0, 1, 256, 512, 1024, 2048, 4096, 8192, 1 << 30]


def main(path):
    rows = [r for r in csv.DictReader(open(path)) if r["device_ms"]]
    if not rows:
        print(f"{path}: no timed steps")
        return
    total = sum(float(r["device_ms"]) for r in rows)
    idle = sum(float(r["idle_ms"]) for r in rows if r["idle_ms"])
    print(f"{path}: {len(rows)} steps, device {total / 1e3:.2f} s, idle between back-to-back steps {idle / 1e3:.2f} s")
    print("| prefill tokens | steps | mean tokens | mean sequences | mean device ms | share | us a token |")
    for lo, hi in zip(EDGES, EDGES[1:]):
        group = [r for r in rows if lo <= int(r["prefill_tokens"]) < hi]
        if not group:
            continue
        ms = [float(r["device_ms"]) for r in group]
        tokens = [int(r["tokens"]) for r in group]
        label = "0 (decode only)" if hi == 1 else f"{lo}-{hi - 1}"
        print(f"| {label} | {len(group)} | {sum(tokens) / len(group):.0f} | "
              f"{sum(int(r['sequences']) for r in group) / len(group):.1f} | {sum(ms) / len(group):.2f} | "
              f"{100 * sum(ms) / total:.1f}% | {1e3 * sum(ms) / sum(tokens):.1f} |")


if __name__ == "__main__":
    main(sys.argv[1])
