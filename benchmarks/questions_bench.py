"""Five questions over a ~1,000-token document: the document prefilled once (a question group)
against one question, and against five separate choice rows with and without the prefix cache.

  python benchmarks/questions_bench.py --docs 8 --repeats 3 --json benchmarks/results/questions.json

Documents: slices of ``--tokens`` tokens (default model's tokenizer) of the license texts in
/usr/share/common-licenses (real English, on every Debian machine), each slice a document, the
same slices for every configuration. Questions: five yes/no and choice questions with the
default templates. Each configuration runs on a fresh ``LLM`` (nothing cached from another),
after a warm-up on a document of its own, ``--repeats`` times on fresh documents' slices of
the same length; the figure is seconds per document (the median over repeats):

* ``one_question``: the first question only (``LLM.annotate``, a question group of one);
* ``five_questions``: the five as one question group (``LLM.annotate``), prefix cache on;
* ``five_questions_no_cache``: the same with the prefix cache off (the document is prefilled
  once by the group itself);
* ``five_rows_no_cache``: five separate choice rows per document (``LLM.generate`` with a
  ``choice`` constraint), prefix cache off: the document prefilled five times;
* ``five_rows_cache``: the same with the prefix cache on (the rows share the document's full
  blocks when they run together).
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import time

QUESTIONS = [
    {"name": "license", "type": "yes_no", "question": "Is this text a software license?"},
    {"name": "copyleft", "type": "yes_no", "question": "Does it require derived works to "
                                                       "use the same license?"},
    {"name": "patents", "type": "yes_no", "question": "Does it mention patents?"},
    {"name": "kind", "type": "choice", "labels": ["permissive", "copyleft", "documentation"],
     "question": "What kind of license is it?"},
    {"name": "clarity", "type": "scale", "range": [1, 5], "question": "How easy is it to read?"},
]


def documents(tokenizer, count: int, tokens: int) -> list[str]:
    """``count`` texts of ``tokens`` tokens each, cut from the license texts in order."""
    ids = []
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        with open(path, encoding="utf-8", errors="replace") as f:
            ids += tokenizer.encode(" ".join(f.read().split()), add_special_tokens=False)
    if len(ids) < count * tokens:
        raise SystemExit(f"only {len(ids)} tokens of license text for {count} documents")
    return [tokenizer.decode(ids[i * tokens:(i + 1) * tokens]) for i in range(count)]


def run(name: str, llm, docs: list[str]) -> None:
    """One configuration over ``docs`` (the work, not timed here)."""
    from mlxpa import SamplingParams, StructuredOutputsParams
    from mlxpa.entrypoints.annotate import question_set

    if name == "one_question":
        outs = llm.annotate(docs, QUESTIONS[:1], use_tqdm=False)
    elif name.startswith("five_questions"):
        outs = llm.annotate(docs, QUESTIONS, use_tqdm=False)
    else:
        qs = question_set(QUESTIONS)
        from mlxpa.annotation.render import prompt_text

        prompts = [prompt_text(d, q) for d in docs for q in qs.questions]
        params = [SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(
            choice=list(q.labels))) for _ in docs for q in qs.questions]
        outs = llm.generate(prompts, params, use_tqdm=False)
    bad = [o.error for o in outs if o.error]
    if bad:
        raise SystemExit(f"{name}: {bad[0]}")


CONFIGS = {"one_question": True, "five_questions": True, "five_questions_no_cache": False,
           "five_rows_no_cache": False, "five_rows_cache": True}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=8, help="documents per repeat")
    ap.add_argument("--tokens", type=int, default=1000, help="tokens per document")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from mlxpa import LLM

    results = {}
    for name, cache in CONFIGS.items():
        llm = LLM(args.model, enable_prefix_caching=cache, kv_cache_memory_bytes=2**30)
        docs = documents(llm.get_tokenizer(), args.docs * args.repeats + 1, args.tokens)
        run(name, llm, docs[-1:])  # warm-up on a document of its own
        seconds = []
        for r in range(args.repeats):
            start = time.perf_counter()
            run(name, llm, docs[r * args.docs:(r + 1) * args.docs])
            seconds.append((time.perf_counter() - start) / args.docs)
        c = llm.llm_engine.counters
        results[name] = {"s_per_doc": statistics.median(seconds), "repeats": seconds,
                         "prefix_cache": cache, "last_call_prompt_tokens": c.prompt_tokens,
                         "last_call_cached_tokens": c.cached_prompt_tokens}
        print(f"{name:26s} {statistics.median(seconds):7.3f} s/doc  {seconds}", flush=True)
        del llm
    one = results["one_question"]["s_per_doc"]
    for r in results.values():
        r["vs_one_question"] = r["s_per_doc"] / one
    print(json.dumps({k: round(v["vs_one_question"], 3) for k, v in results.items()}))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"docs": args.docs, "tokens": args.tokens, "repeats": args.repeats,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
