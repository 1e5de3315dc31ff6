"""Peak memory of ``mlxpa run`` against input size: it should stay flat (inputs stream).

Writes JSONL inputs of each size (default 1,000 and 100,000 rows of distinct short prompts),
runs ``mlxpa run`` on each in a subprocess on a tiny random model (``tests/tiny_models``) with
``--max-tokens 1`` and a 20 MiB KV pool (so the pool does not hide the rest), and reports
each child's peak resident set size (``os.wait4``'s ``ru_maxrss``) and wall time.
Run from the repository root::

    python benchmarks/stream_memory.py                     # 1k and 100k rows
    python benchmarks/stream_memory.py --rows 1000,10000 --json mem.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from rss import peak_rss_run

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_input(path: str, rows: int) -> None:
    """``rows`` JSONL rows with distinct prompts (a few shared words, a unique number)."""
    with open(path, "w") as f:
        for i in range(rows):
            f.write(json.dumps({"id": f"row-{i}", "prompt": f"Item {i}: say something"}) + "\n")


def measure(model: str, src: str, out: str, extra: list[str]) -> dict:
    """Run ``mlxpa run`` once; returns its peak RSS (MiB), wall seconds and exit status."""
    cmd = [sys.executable, "-m", "mlxpa", "run", src, "-o", out, "--model", model,
           "--max-tokens", "1", "--kv-memory", "0.02", "--quiet", *extra]
    return peak_rss_run(cmd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1000,100000", help="Comma-separated input sizes.")
    parser.add_argument("--model", help="Model folder (default: a tiny random llama).")
    parser.add_argument("--output-ext", default="jsonl", choices=["jsonl", "parquet"])
    parser.add_argument("--json", help="Write the figures here.")
    parser.add_argument("extra", nargs="*", help="More `mlxpa run` options (after --).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from tests.tiny_models import save_tiny_model

            model = save_tiny_model(os.path.join(tmp, "tiny"))
        results = []
        for rows in (int(r) for r in args.rows.split(",")):
            src = os.path.join(tmp, f"in-{rows}.jsonl")
            out = os.path.join(tmp, f"out-{rows}.{args.output_ext}")
            write_input(src, rows)
            r = {"rows": rows, **measure(model, src, out, args.extra)}
            results.append(r)
            print(f"{rows:>8} rows: peak RSS {r['peak_rss_mib']:8.1f} MiB, "
                  f"{r['wall_s']:7.1f} s, exit {r['status']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
