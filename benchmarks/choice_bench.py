"""Choice rows: throughput, greedy label against the scores, draws against ``choice_probs``.

Each measurement runs through the ``mlxpa`` command of the checkout on ``PYTHONPATH``
(so the same script times older code: ``PYTHONPATH=/path/to/old python
benchmarks/choice_bench.py ...``):

throughput: ``mlxpa bench --workload annotation --num-prompts N --baselines mlxpa``; its
    ``requests_per_s`` is choice rows per second (one timed run; the bench warms up first).
argmax: ``--rows`` reviews as chat rows whose five labels share first tokens ("very
    positive" / "very negative" with "positive" / "negative", "neutral"), greedy, through
    ``mlxpa run``: the fraction of rows whose ``text`` is the label with the highest
    ``choice_logprobs`` (ties: the label given first).
chi2: one review (the argmax part's row whose label probabilities are the most even, so
    every label is drawn), ``--samples`` seeded temperature-1 samples (rows of ``n`` <= 1000,
    seeds 1, 2, ...), through ``mlxpa run``: the label counts against ``choice_probs``
    (code without that column: ``softmax(choice_logprobs)``), Pearson's
    chi-square statistic over the labels (those expected fewer than 5 times pooled into one
    cell), its degrees of freedom (cells - 1) and p-value (:func:`chi2_sf`; the check passes
    at p > 0.01).

    python benchmarks/choice_bench.py --out benchmarks/results/choice.json
    python benchmarks/choice_bench.py --model DIR --rows 6 --samples 40 --num-prompts 4
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

LABELS = ["very positive", "positive", "neutral", "negative", "very negative"]
SHOTS = [("Absolutely love it, the best thing I bought this year!", "very positive"),
         ("Works fine and does the job.", "positive"), ("It is a phone case.", "neutral"),
         ("It stopped charging after two weeks.", "negative"),
         ("Dangerous junk: it caught fire on day one.", "very negative")]
PARTS = (("The", "This", "My new", "Our"),
         ("blender", "phone case", "desk lamp", "backpack", "kettle", "keyboard", "tent"),
         ("works great", "broke after a week", "arrived on time", "is too loud",
          "looks lovely", "stopped charging", "is fine I guess", "exceeded my expectations"),
         ("and support was helpful.", "and nobody answered my emails.", "so I returned it.",
          "so I bought another one.", "."))


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for a chi-square variable with ``df`` degrees of freedom (closed forms:
    even ``df = 2k``: ``exp(-x/2) * sum_{i<k} (x/2)^i / i!``; odd ``df = 2k + 1``:
    ``erfc(sqrt(x/2)) + exp(-x/2) * sum_{i=1..k} (x/2)^(i-1/2) / Gamma(i + 1/2)``)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if x <= 0:
        return 1.0
    h = x / 2
    if df % 2 == 0:
        return math.exp(-h) * sum(h ** i / math.factorial(i) for i in range(df // 2))
    return math.erfc(math.sqrt(h)) + math.exp(-h) * sum(
        h ** (i - 0.5) / math.gamma(i + 0.5) for i in range(1, df // 2 + 1))


def messages(review: str) -> list[dict]:
    """The few-shot chat: each shot a user turn and the assistant's label, then ``review``."""
    intro = ("Label the sentiment of each product review: very positive, positive, neutral, "
             "negative or very negative.\n\n")
    out: list[dict] = []
    for k, (text, label) in enumerate(SHOTS):
        out += [{"role": "user", "content": (intro if k == 0 else "") + "Review: " + text},
                {"role": "assistant", "content": label}]
    return out + [{"role": "user", "content": "Review: " + review}]


def reviews(n: int) -> list[str]:
    """``n`` synthetic reviews, every combination of the parts in a fixed order."""
    out = []
    for i in range(n):
        words, k = [], i
        for part in PARTS:
            words.append(part[k % len(part)])
            k //= len(part)
        out.append(" ".join(words[:3]) + ("." if words[3] == "." else " " + words[3]))
    return out


def mlxpa(*args: str, model: str | None) -> float:
    """Run ``python -m mlxpa ARGS [--model M]``; returns its seconds; raises on failure."""
    cmd = [sys.executable, "-m", "mlxpa", *args, *(["--model", model] if model else [])]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def run_rows(rows: list[dict], folder: str, name: str, model: str | None) -> list[dict]:
    src, out = os.path.join(folder, f"{name}.jsonl"), os.path.join(folder, f"{name}.out.jsonl")
    with open(src, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    mlxpa("run", src, "-o", out, "--quiet", model=model)
    with open(out) as f:
        return [json.loads(line) for line in f]


def throughput(num_prompts: int, folder: str, model: str | None) -> dict:
    path = os.path.join(folder, "bench.json")
    mlxpa("bench", "--workload", "annotation", "--num-prompts", str(num_prompts),
          "--baselines", "mlxpa", "--json", path, "--quiet", model=model)
    with open(path) as f:
        fig = json.load(f)["systems"]["mlxpa"]
    return {"num_prompts": num_prompts, "choice_rows_per_s": fig["requests_per_s"],
            "elapsed_s": fig["elapsed_s"], "generation_tokens": fig["generation_tokens"]}


def first_best(scores: dict[str, float]) -> str:
    """The label with the highest score, the first given on ties (``scores`` keeps order)."""
    return max(scores, key=scores.get)


def label_probs(record: dict) -> tuple[list[float], str]:
    """A result row's label probabilities (``LABELS`` order) and where they came from:
    ``choice_probs``, or, from code without that column, ``softmax(choice_logprobs)``."""
    if "choice_probs" in record:
        return [record["choice_probs"][c] for c in LABELS], "choice_probs"
    scores = [record["choice_logprobs"][c] for c in LABELS]
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    return [w / sum(weights) for w in weights], "softmax(choice_logprobs)"


def argmax_agreement(num_rows: int, folder: str, model: str | None) -> tuple[dict, str]:
    """The figures, and the review whose label probabilities are the most even."""
    texts = reviews(num_rows)
    rows = [{"id": i, "messages": messages(r), "structured_outputs": {"choice": LABELS},
             "temperature": 0} for i, r in enumerate(texts)]
    out = run_rows(rows, folder, "argmax", model)
    agree = sum(r["text"] == first_best(r["choice_logprobs"]) for r in out)
    even = max(out, key=lambda r: min(label_probs(r)[0]))
    return ({"rows": len(out), "labels": LABELS, "text_is_argmax": agree,
             "fraction": agree / len(out)}, texts[even["id"]])


def pooled(counts: list[int], expected: list[float]) -> list[tuple[int, float]]:
    """``(observed, expected)`` cells: those expected fewer than 5 times pooled into one (and
    that one into the smallest other cell while it is still below 5)."""
    cells = [(o, e) for o, e in zip(counts, expected) if e >= 5]
    small = [(o, e) for o, e in zip(counts, expected) if e < 5]
    if small:
        rest = (sum(o for o, _ in small), sum(e for _, e in small))
        if rest[1] < 5 and cells:
            k = min(range(len(cells)), key=lambda i: cells[i][1])
            rest = (rest[0] + cells[k][0], rest[1] + cells[k][1])
            del cells[k]
        cells.append(rest)
    return cells


def label_draws(num_samples: int, review: str, folder: str, model: str | None) -> dict:
    per_row = min(1000, num_samples)
    rows, left, seed = [], num_samples, 1
    while left > 0:
        n = min(per_row, left)
        rows.append({"id": f"s{seed}", "messages": messages(review), "n": n, "seed": seed,
                     "temperature": 1.0, "structured_outputs": {"choice": LABELS}})
        left, seed = left - n, seed + 1
    out = run_rows(rows, folder, "chi2", model)
    probs, source = label_probs(out[0])
    counts = [sum(r["text"] == c for r in out) for c in LABELS]
    total = sum(counts)
    cells = pooled(counts, [p * total for p in probs])
    stat = sum((o - e) ** 2 / e for o, e in cells if e > 0)
    df = len(cells) - 1
    return {"samples": len(out), "review": review, "labels": LABELS, "counts": counts,
            "probs": probs, "probs_from": source, "cells": len(cells),
            "min_expected": min(e for _, e in cells), "chi2": stat, "df": df,
            "p_value": chi2_sf(stat, df) if df else None,
            "outside_labels": len(out) - total}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="model for mlxpa (default: mlxpa's default model)")
    ap.add_argument("--num-prompts", type=int, default=128, help="throughput: rows")
    ap.add_argument("--rows", type=int, default=200, help="argmax: rows")
    ap.add_argument("--samples", type=int, default=2000, help="chi2: samples of one review")
    ap.add_argument("--parts", default="throughput,argmax,chi2",
                    help="comma-separated: throughput, argmax, chi2")
    ap.add_argument("--out", help="write the figures here as JSON")
    args = ap.parse_args()
    parts = args.parts.split(",")
    figures: dict = {"python_path": os.environ.get("PYTHONPATH", "")}
    review = reviews(3)[2]
    with tempfile.TemporaryDirectory() as folder:
        if "argmax" in parts:
            figures["argmax"], review = argmax_agreement(args.rows, folder, args.model)
            print(f"argmax: text is the highest-scoring label in "
                  f"{figures['argmax']['text_is_argmax']}/{figures['argmax']['rows']} rows")
        if "chi2" in parts:
            c = figures["chi2"] = label_draws(args.samples, review, folder, args.model)
            verdict = ("no test (one cell)" if c["p_value"] is None
                       else f"p = {c['p_value']:.3g}")
            print(f"chi2: {c['samples']} samples of {review!r}, counts {c['counts']}, "
                  f"expected from {c['probs_from']} "
                  f"{[round(p * sum(c['counts']), 1) for p in c['probs']]}, "
                  f"chi2 {c['chi2']:.2f} (df {c['df']}), {verdict}")
        if "throughput" in parts:
            t = figures["throughput"] = throughput(args.num_prompts, folder, args.model)
            print(f"throughput: {t['choice_rows_per_s']:.2f} choice rows/s "
                  f"({t['num_prompts']} rows, {t['elapsed_s']:.1f} s)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
