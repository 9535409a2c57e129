"""Compares `nibble eval gsm8k --predictions` files of one question set (issue 18's accuracy study):
accuracy with a 95% Wilson interval and the invalid rate per run, then each run against the first,
question by question (the questions only one of them got right, and McNemar's exact two-sided p).

    python3 scripts/gsm8k_compare.py NAME=pred.jsonl [NAME=pred.jsonl ...] [--markdown]
        [--unseen QUESTIONS.jsonl TRAIN.jsonl]   (only the questions whose text training never saw)
"""
import argparse
import json
import math


def wilson(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact test: under the null each discordant question is a fair coin."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="NAME=predictions.jsonl; the first is the baseline")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--unseen", nargs=2, metavar=("QUESTIONS", "TRAIN"),
                        help="the eval's question file and the training problems: keep questions not in TRAIN")
    a = parser.parse_args()
    keep = None
    if a.unseen:
        seen = {json.loads(line)["question"] for line in open(a.unseen[1])}
        questions = [json.loads(line)["question"] for line in open(a.unseen[0])]
        keep = {i for i, q in enumerate(questions) if q not in seen}
    runs = []
    for spec in a.runs:
        name, _, path = spec.partition("=")
        rows = [json.loads(line) for line in open(path)]
        rows = [r for r in rows if keep is None or r["index"] in keep]
        runs.append((name, {r["index"]: r for r in rows}))
    base_name, base = runs[0]
    header = ["run", "n", "accuracy", "95% CI", "invalid", f"only {base_name} right", "only this right", "McNemar p"]
    lines = []
    for name, rows in runs:
        if rows.keys() != base.keys():
            raise SystemExit(f"{name}: not the same questions as {base_name}")
        n = len(rows)
        correct = sum(r["correct"] for r in rows.values())
        invalid = sum(r["prediction"] is None for r in rows.values())
        lo, hi = wilson(correct, n)
        only_base = sum(base[i]["correct"] and not rows[i]["correct"] for i in rows)
        only_this = sum(rows[i]["correct"] and not base[i]["correct"] for i in rows)
        lines.append([name, str(n), f"{correct / n:.3f}", f"{lo:.3f}–{hi:.3f}", f"{invalid / n:.3f}",
                      str(only_base), str(only_this), f"{mcnemar_exact(only_base, only_this):.3f}"])
    if a.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(r[i]) for r in [header] + lines) for i in range(len(header))]
        for line in [header] + lines:
            print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)))


if __name__ == "__main__":
    main()
