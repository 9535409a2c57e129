#!/usr/bin/env python3
"""`nibble bench latency` logs side by side (one log a variant or build, as the device scripts write
them): a row per (mode, test), a column per log, each value beside its speed change against the first
log's. Throughput rows (ppN, tgN, S_TG bB) show tok/s; mixed steps (mix bB+pP) ms a step, as
docs/lab/perf-notebook.md quotes them. The change is always speed: +5.0% means 5% more tok/s, or a step taking
1/1.05 of the first log's time. A log without a row gets "—" (a variant that crashed or skipped it).

    latency_compare.py [--name A --name B ...] LOG [LOG ...]
"""
import argparse
import pathlib
import re
import sys

ROW = re.compile(r"^(\S+)\s+(pp\d+|tg\d+|S_TG b\d+|mix b\d+\+p\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s*$")


def parse(path):
    """{(mode, test): (tok/s, ms a step)} of one log, in the order the rows come."""
    rows = {}
    if not pathlib.Path(path).exists():  # (a variant that never wrote its log: every row "—")
        return rows
    for line in pathlib.Path(path).read_text(errors="replace").splitlines():
        m = ROW.match(line)
        if m:
            rows[(m.group(1), m.group(2))] = (float(m.group(4)), float(m.group(5)))
    return rows


def shown(test, values):
    """The number a row shows (tok/s, or ms a step for mixed steps) and its speed (higher is faster)."""
    tok_s, ms = values
    return (ms, 1.0 / ms) if test.startswith("mix") else (tok_s, tok_s)


def table(logs, names):
    parsed = [parse(p) for p in logs]
    keys = []
    for rows in parsed:
        keys += [k for k in rows if k not in keys]
    lines = ["| mode | test | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for mode, test in keys:
        base = parsed[0].get((mode, test))
        cells = []
        for i, rows in enumerate(parsed):
            if (mode, test) not in rows:
                cells.append("—")
                continue
            value, speed = shown(test, rows[(mode, test)])
            text = f"{value:,.2f}" if test.startswith("mix") else f"{value:,.1f}"
            if i > 0 and base:
                text += f" ({100 * (speed / shown(test, base)[1] - 1):+.1f}%)"
            cells.append(text)
        unit = "ms" if test.startswith("mix") else "tok/s"
        lines.append(f"| {mode} | {test} ({unit}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", action="append", help="a column's name, once a log in order (default: the logs' file names)")
    ap.add_argument("logs", nargs="+")
    a = ap.parse_intermixed_args(argv)
    names = a.name or [pathlib.Path(p).stem.removeprefix("latency_") for p in a.logs]
    if len(names) != len(a.logs):
        ap.error(f"{len(names)} names for {len(a.logs)} logs")
    print(table(a.logs, names))


if __name__ == "__main__":
    main(sys.argv[1:])
