"""Peak RSS of ``mlxpa run`` on a quantized model dequantized at load against its float twin.

On MLX's CPU back end a quantized model is dequantized while it loads
(:mod:`mlxpa.loader.dequantize`); this measures what that costs in memory: each model runs the
same input in a subprocess, in turn, ``--repeats`` times, and the script reports each run's peak
resident set size (``os.wait4``'s ``ru_maxrss``), the medians and their ratio. RSS is not a
timing: a busy machine does not change it much. Make the quantized copy with mlx-lm's converter
first, then run from the repository root::

    python -m mlx_lm convert --hf-path ~/.cache/mlxpa/models/gemma-3-270m-q4_k_m-f32 \\
        -q --q-bits 8 --mlx-path /tmp/gemma-8bit
    python benchmarks/dequant_memory.py --quantized /tmp/gemma-8bit
    python benchmarks/dequant_memory.py --quantized /tmp/gemma-8bit --float other-folder \\
        --repeats 5 --json mem.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

from rss import peak_rss_run


def measure(model: str, src: str, out: str, extra: list[str]) -> dict:
    """Run ``mlxpa run`` once; returns its peak RSS (MiB), wall seconds and exit status."""
    if os.path.exists(out):
        os.remove(out)
    cmd = [sys.executable, "-m", "mlxpa", "run", src, "-o", out, "--model", model, "--quiet",
           *extra]
    return peak_rss_run(cmd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quantized", required=True, help="The quantized MLX model folder.")
    parser.add_argument("--float", dest="float_model",
                        default=os.path.expanduser("~/.cache/mlxpa/models/"
                                                   "gemma-3-270m-q4_k_m-f32"),
                        help="The float model folder (default: the default model).")
    parser.add_argument("--input", default="examples/prompts.jsonl", help="The JSONL input.")
    parser.add_argument("--repeats", type=int, default=3, help="Runs of each model.")
    parser.add_argument("--json", help="Write the figures here.")
    parser.add_argument("extra", nargs="*", help="More `mlxpa run` options (after --).")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"float": [], "quantized": []}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.jsonl")
        for i in range(args.repeats):
            for kind, model in (("float", args.float_model), ("quantized", args.quantized)):
                r = measure(model, args.input, out, args.extra)
                runs[kind].append(r)
                print(f"run {i + 1} {kind:>9}: peak RSS {r['peak_rss_mib']:8.1f} MiB, "
                      f"{r['wall_s']:6.1f} s, exit {r['status']}", flush=True)
    medians = {k: statistics.median(r["peak_rss_mib"] for r in v) for k, v in runs.items()}
    ratio = medians["quantized"] / medians["float"]
    print(f"median peak RSS: float {medians['float']:.1f} MiB, quantized "
          f"{medians['quantized']:.1f} MiB, ratio {ratio:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "median_peak_rss_mib": medians, "ratio": ratio}, f,
                      indent=2)


if __name__ == "__main__":
    main()
