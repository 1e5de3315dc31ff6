"""Structured outputs: validity and overhead on the default model.

validity: a 200-row file mixing choice, regex, json_object and three JSON schemas (nested
objects, enums, arrays, required fields, ``additionalProperties: false``) goes through
``mlxpa run``; every row that finishes with ``stop`` must parse and validate (``jsonschema``).

overhead: 128 rows constrained by a JSON schema, then the same prompts unconstrained with
``max_tokens`` set to the number of tokens each constrained row generated (``ignore_eos``), so
both runs generate the same tokens; prints both throughputs, their ratio and the bitmask fill
time per step (``mask_ms_per_step``, also in each run's metrics JSON).

    python benchmarks/structured_bench.py --out benchmarks/results/structured.json
    python benchmarks/structured_bench.py --rows 12 --overhead-rows 8   # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time

import jsonschema

SCHEMAS = {
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 120}},
            "required": ["name", "age"], "additionalProperties": False},
        "active": {"type": "boolean"}},
        "required": ["user", "active"], "additionalProperties": False},
    "enum_array": {"type": "object", "properties": {
        "sentiment": {"enum": ["positive", "negative", "neutral"]},
        "topics": {"type": "array", "items": {"type": "string", "maxLength": 20},
                   "minItems": 1, "maxItems": 3}},
        "required": ["sentiment", "topics"], "additionalProperties": False},
    "product": {"type": "object", "properties": {
        "product": {"type": "string", "maxLength": 30}, "price": {"type": "number"},
        "currency": {"enum": ["USD", "EUR", "GBP"]}, "in_stock": {"type": "boolean"}},
        "required": ["product", "price", "currency", "in_stock"],
        "additionalProperties": False},
}
REGEX = r"\(\d{3}\) \d{3}-\d{4}"
TEXTS = ["Ana Silva (29) just renewed her subscription; call her at 555 201 3344.",
         "The Zephyr kettle costs 49.90 EUR and is back in stock, says Tom, 61.",
         "Loved the battery life, hated the screen glare. Support number 212-555-0199.",
         "Jonas, a 35-year-old teacher, cancelled because shipping took a month.",
         "Blue Ridge hiking boots, 120 USD, sold out until May; great grip on wet rock."]


def rows(n: int) -> list[dict]:
    """``n`` rows cycling through the six constraint kinds."""
    kinds = ["choice", "regex", "json_object", *SCHEMAS]
    out = []
    for i in range(n):
        kind, text = kinds[i % len(kinds)], TEXTS[(i // len(kinds)) % len(TEXTS)]
        ask = {"choice": "Does the text mention a price? Answer yes or no.",
               "regex": "Write a US phone number for this customer.",
               "json_object": "Summarise the text as a JSON object."}.get(
                   kind, "Extract the information as JSON.")
        row = {"id": f"{kind}-{i}", "messages": [
            {"role": "user", "content": f"{ask}\n\nText: {text}"}], "max_tokens": 128}
        if kind == "choice":
            row["structured_outputs"] = {"choice": ["yes", "no"]}
        elif kind == "regex":
            row["structured_outputs"] = {"regex": REGEX}
        elif kind == "json_object":
            row["response_format"] = {"type": "json_object"}
        else:
            row["response_format"] = {"type": "json_schema", "json_schema": {
                "name": kind, "schema": SCHEMAS[kind], "strict": True}}
        out.append(row)
    return out


def check_row(row: dict, result: dict) -> bool:
    """Whether ``result`` (finished with stop) satisfies ``row``'s constraint."""
    kind, text = row["id"].rsplit("-", 1)[0], result["text"]
    try:
        if kind == "choice":
            return text in ("yes", "no")
        if kind == "regex":
            return re.fullmatch(REGEX, text) is not None
        value = json.loads(text)
        if kind == "json_object":
            return isinstance(value, dict)
        jsonschema.validate(value, SCHEMAS[kind])
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def validity(model: str | None, n: int, workdir: str) -> dict:
    from mlxpa.batch.run import RunOptions, run_file
    from mlxpa.config import EngineConfig
    from mlxpa.sampling_params import SamplingParams

    src, out = os.path.join(workdir, "mix.jsonl"), os.path.join(workdir, "mix.out.jsonl")
    data = rows(n)
    with open(src, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in data)
    options = RunOptions(metrics_json=os.path.join(workdir, "mix.metrics.json"),
                         show_progress=False)
    stats = run_file(src, out, EngineConfig(model=model), SamplingParams(max_tokens=128),
                     options)
    with open(out) as f:
        results = [json.loads(line) for line in f]
    by_kind: dict[str, dict] = {}
    for row, res in zip(data, results):
        k = by_kind.setdefault(row["id"].rsplit("-", 1)[0],
                               {"rows": 0, "stop": 0, "valid": 0, "length": 0, "error": 0})
        k["rows"] += 1
        reason = res["finish_reason"]
        k[reason if reason in ("stop", "length") else "error"] += 1
        if reason == "stop":
            k["valid"] += check_row(row, res)
    stop = sum(k["stop"] for k in by_kind.values())
    valid = sum(k["valid"] for k in by_kind.values())
    return {"rows": n, "stop": stop, "valid_of_stop": valid,
            "valid_fraction": valid / stop if stop else None, "by_kind": by_kind,
            "metrics": stats.to_dict()}


def overhead(model: str | None, n: int) -> dict:
    from mlxpa.config import EngineConfig
    from mlxpa.engine import LLMEngine
    from mlxpa.engine.metrics import summarize
    from mlxpa.loader.models import load_model
    from mlxpa.request import EngineRequest
    from mlxpa.sampling_params import SamplingParams, StructuredOutput

    mdl, tok, _ = load_model(EngineConfig(model=model))
    so = StructuredOutput.make("json", SCHEMAS["nested"])
    prompts = [tok.apply_chat_template(
        [{"role": "user", "content": f"Extract the person as JSON.\n\nText: {TEXTS[i % 5]} "
                                     f"(case {i})"}], add_generation_prompt=True)
        for i in range(n)]

    def timed(params: list[SamplingParams]) -> tuple[dict, dict]:
        eng = LLMEngine(EngineConfig(model=model), mdl, tok)
        if any(p.structured_outputs for p in params):  # tokenizer built before the clock starts
            eng.prepare()
        eng.counters.start_time = time.perf_counter()
        outs = {int(o.request_id): o for o in eng.generate(
            EngineRequest(str(i), p, sp) for i, (p, sp) in enumerate(zip(prompts, params)))}
        return outs, summarize(eng.counters).to_dict()

    c_outs, c_stats = timed([SamplingParams(max_tokens=128, structured_outputs=so)] * n)
    lens = [max(1, len(c_outs[i].token_ids)) for i in range(n)]
    _, u_stats = timed([SamplingParams(max_tokens=k, ignore_eos=True) for k in lens])
    return {"rows": n, "generated_tokens": sum(lens),
            "constrained_output_tokens_per_s": c_stats["output_tokens_per_s"],
            "unconstrained_output_tokens_per_s": u_stats["output_tokens_per_s"],
            "ratio": c_stats["output_tokens_per_s"] / u_stats["output_tokens_per_s"],
            "mask_ms_per_step": c_stats["mask_ms_per_step"],
            "constrained": c_stats, "unconstrained": u_stats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--overhead-rows", type=int, default=128)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = {"validity": validity(args.model, args.rows, tmp)}
    print(json.dumps(result["validity"], indent=1, default=str)[:2000])
    result["overhead"] = overhead(args.model, args.overhead_rows)
    o = result["overhead"]
    print(f"overhead: constrained {o['constrained_output_tokens_per_s']:.1f} tok/s, "
          f"unconstrained {o['unconstrained_output_tokens_per_s']:.1f} tok/s, "
          f"ratio {o['ratio']:.3f}, mask {o['mask_ms_per_step']} ms/step")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
