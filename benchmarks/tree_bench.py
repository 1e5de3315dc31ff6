"""Time systems on one workload file, each in a process of its own (its peak RSS), optionally
from two checkouts: this tree's mlxpa against an earlier tree's, and mlx-lm, on the very same
prompts (``benchmarks/workload_file.py`` writes them).

Each run is ``mlxpa bench --workload file --input FILE --baselines SYSTEM --json ...`` with
``PYTHONPATH`` set to the run's tree; the figures are its JSON's, plus the process's peak RSS
(``benchmarks/rss.py``). Runs alternate over ``--repeats``; medians are reported.

    python benchmarks/tree_bench.py FILE --runs mlxpa=.,before=/path/to/old:mlxpa,mlx-lm=.:mlx-lm
        [--model FOLDER] [--repeats 1] [--json out.json] [-- extra bench options]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

from rss import peak_rss_run  # benchmarks/rss.py

KEYS = ("elapsed_s", "total_tokens_per_s", "output_tokens_per_s", "peak_memory_bytes",
        "kv_bytes", "peak_running_requests", "num_preemptions", "prefix_cache_hit_rate",
        "cached_prompt_tokens", "peak_kv_bytes_by_group")


def run_once(tree: str, system: str, path: str, model: str | None, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "b.json")
        cmd = [sys.executable, "-m", "mlxpa", "bench", "--workload", "file", "--input", path,
               "--baselines", system, "--json", out, "-q",
               *(["--model", model] if model else []), *extra]
        rss = peak_rss_run(cmd, dict(os.environ, PYTHONPATH=os.path.abspath(tree)))
        if rss["status"] != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({rss['status']})")
        with open(out) as f:
            data = json.load(f)
    figures = data["systems"][system]
    return {**{k: figures.get(k) for k in KEYS}, "peak_rss_mib": rss["peak_rss_mib"],
            "prompt_tokens": data["workload"]["prompt_tokens"],
            "output_tokens": data["workload"]["output_tokens"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--runs", required=True,
                    help="label=TREE[:SYSTEM],... (SYSTEM default mlxpa)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", default=None)
    args, extra = ap.parse_known_args()
    extra = [a for a in extra if a != "--"]
    runs = []
    for item in args.runs.split(","):
        label, spec = item.split("=", 1)
        tree, _, system = spec.partition(":")
        runs.append((label, tree, system or "mlxpa"))
    results: dict[str, list[dict]] = {label: [] for label, _, _ in runs}
    for r in range(args.repeats):
        for label, tree, system in runs:
            got = run_once(tree, system, args.file, args.model, extra)
            results[label].append(got)
            print(f"[{r + 1}/{args.repeats}] {label}: {got['elapsed_s']:.1f} s, "
                  f"{got['total_tokens_per_s']:.1f} total tok/s, "
                  f"{got['output_tokens_per_s']:.2f} output tok/s, peak RSS "
                  f"{got['peak_rss_mib']:,.0f} MiB, running at peak "
                  f"{got['peak_running_requests']}, preemptions {got['num_preemptions']}",
                  flush=True)
    medians = {label: {k: statistics.median(x[k] for x in rs) for k in
                       ("elapsed_s", "total_tokens_per_s", "output_tokens_per_s",
                        "peak_rss_mib")} for label, rs in results.items()}
    first = runs[0][0]
    for label, m in medians.items():
        print(f"{label}: median {m['total_tokens_per_s']:.1f} total tok/s "
              f"({m['total_tokens_per_s'] / medians[first]['total_tokens_per_s']:.3f}x "
              f"{first}), {m['elapsed_s']:.1f} s, peak RSS {m['peak_rss_mib']:,.0f} MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"file": args.file, "runs": {label: {"tree": tree, "system": system}
                                                   for label, tree, system in runs},
                       "extra": extra, "results": results, "medians": medians}, f, indent=2)


if __name__ == "__main__":
    main()
