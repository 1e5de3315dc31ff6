"""``LLM.generate`` against ``mlxpa run`` on the same rows: the README example's rows
(``examples/prompts.jsonl``), the same model, one run of each per repeat, interleaved (the
order alternates between repeats).

Each side runs in a fresh process, as a user runs it, and is timed the same way, over the
generation pass only (the model load is not timed): ``mlxpa run FILE -o OUT --metrics-json``
reports its output tokens/s; the other process builds ``LLM(model)``, reads the file's lines
as dicts and calls ``llm.generate(rows)``, whose statistics (``llm.llm_engine.counters``:
from the call's start) give the same figure. Texts must be identical (every sample of every
row, by id); the script exits 1 when they are not. Target: the ratio within 5%.

    python benchmarks/llm_vs_run.py                          # the default model, 1 repeat
    python benchmarks/llm_vs_run.py --model DIR --repeats 3 --json results/llm_vs_run.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_rows(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_llm(model: str | None, source: str, out: str) -> None:
    """The ``LLM`` side, in its own process: ``{"output_tokens_per_s", "elapsed_s",
    "generation_tokens", "texts": {id: [text per sample]}}`` written to ``out``."""
    import mlxpa  # noqa: F401  (first: the fast BLAS before mlx)
    from mlxpa import LLM
    from mlxpa.engine.metrics import summarize

    llm = LLM(model)
    outs = llm.generate(read_rows(source), use_tqdm=False)
    stats = summarize(llm.llm_engine.counters)
    texts = {o.request_id: [c.text for c in o.outputs] for o in outs}
    with open(out, "w") as f:
        json.dump({"output_tokens_per_s": stats.output_tokens_per_s,
                   "elapsed_s": stats.elapsed_s, "generation_tokens": stats.generation_tokens,
                   "texts": texts}, f)


def side(name: str, model: str | None, source: str, work: str) -> dict:
    """One timed run of ``name`` (``run`` or ``llm``) in a fresh process."""
    result = os.path.join(work, f"{name}.json")
    if name == "llm":
        cmd = [sys.executable, __file__, "--side", "llm", "--input", source, "--out", result]
        cmd += ["--model", model] if model else []
        subprocess.run(cmd, check=True)
        with open(result) as f:
            return json.load(f)
    out = os.path.join(work, "out.jsonl")
    cmd = [sys.executable, "-m", "mlxpa", "run", source, "-o", out, "--overwrite", "-q",
           "--metrics-json", result, *(["--model", model] if model else [])]
    subprocess.run(cmd, check=True)
    with open(result) as f:
        stats = json.load(f)
    texts: dict[str, list[str]] = {}
    for record in read_rows(out):
        texts.setdefault(str(record["id"]), []).append(record["text"])
    return {"output_tokens_per_s": stats["output_tokens_per_s"],
            "elapsed_s": stats["elapsed_s"], "generation_tokens": stats["generation_tokens"],
            "texts": texts}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model (default: mlxpa's default model)")
    p.add_argument("--input", default=os.path.join(ROOT, "examples", "prompts.jsonl"))
    p.add_argument("--repeats", type=int, default=1, help="runs of each side, interleaved")
    p.add_argument("--json", default=None, help="write the runs and the summary here")
    p.add_argument("--side", choices=("llm",), default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.side == "llm":
        run_llm(a.model, a.input, a.out)
        return 0
    runs: dict[str, list[dict]] = {"run": [], "llm": []}
    with tempfile.TemporaryDirectory(prefix="llm-vs-run-") as work:
        for r in range(a.repeats):
            for name in (("run", "llm") if r % 2 == 0 else ("llm", "run")):
                runs[name].append(side(name, a.model, a.input, work))
                print(f"repeat {r + 1} {name:>3}: {runs[name][-1]['output_tokens_per_s']:8.2f} "
                      f"output tok/s, {runs[name][-1]['elapsed_s']:7.2f} s", flush=True)
    identical = all(x["texts"] == runs["run"][0]["texts"] for x in runs["run"] + runs["llm"])
    rate = {k: statistics.median(x["output_tokens_per_s"] for x in v) for k, v in runs.items()}
    ratio = rate["llm"] / rate["run"] if rate["run"] else float("nan")
    print(f"{os.path.relpath(a.input)}: {len(runs['run'][0]['texts'])} rows, "
          f"{runs['run'][0]['generation_tokens']} output tokens; medians of {a.repeats}")
    print(f"mlxpa run     {rate['run']:8.2f} output tok/s")
    print(f"LLM.generate  {rate['llm']:8.2f} output tok/s  ({ratio:.3f}x mlxpa run; target "
          "within 5%)")
    print(f"texts identical: {identical}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "input": a.input, "repeats": a.repeats,
                       "output_tokens_per_s": rate, "ratio": ratio, "identical": identical,
                       "runs": {k: [{n: x[n] for n in x if n != "texts"} for x in v]
                                for k, v in runs.items()}}, f, indent=2)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
