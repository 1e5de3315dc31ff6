"""A labelled data set for annotation and calibration: Debian package descriptions and their
archive section, read offline from this machine's apt lists; and the measurement of the
default model's calibration on it, over several few-shot prompt variants and splits.

  python benchmarks/debian_sections.py build -o debian.jsonl --examples-out debian_ex.json
  python benchmarks/debian_sections.py measure debian.jsonl debian_ex.json \\
      --json benchmarks/results/debian_calibration.json
  python benchmarks/debian_sections.py questions debian_ex.json section-line-1shot -o q.json
  mlxpa calibrate debian.jsonl --questions q.json -o cal.json --content-free

``build`` reads the ``Packages`` index of the largest ``*_main_binary-*_Packages*`` list under
/var/lib/apt/lists (``apt-get update`` fills it; the long descriptions come from the
``Translation-en`` list next to it when apt fetched one: ``apt-get update -o
Acquire::Languages=en``), keeps one package per source package (binary packages of one source
repeat their text), and draws the same number of packages from each of :data:`SECTIONS` with a
fixed seed (as many as the smallest section allows). A document is the package's description
(its synopsis and first paragraph, at most :data:`MAX_CHARS` characters); the gold label is
its section. :data:`MAX_SHOTS` packages of each section, kept out of the rows, are the worked
examples the prompt variants draw on.

``measure`` scores every row under each prompt variant of :data:`VARIANTS` with
``LLM.annotate`` (the pipeline of ``mlxpa run --questions``), with contextual calibration's
content-free documents, then for each of ``--seeds`` splits (``--holdout`` held out) fits a
temperature, and a bias then a temperature, on the fitting rows and reports the held-out
figures before and after: mean and standard deviation over the splits. A variant whose
template lists the labels is also scored with them listed in reverse (the label order check).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import subprocess
import sys
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from mlxpa.annotation.calibration import calibrate
from mlxpa.annotation.metrics import quality
from mlxpa.annotation.questions import Question, QuestionSet
from mlxpa.annotation.render import few_shot_preamble
from mlxpa.annotation.report import reliability_diagram
from mlxpa.annotation.temperature import calibrated_probs

# Frequent sections whose packages a reader tells apart by their description.
SECTIONS = ("games", "science", "fonts", "sound", "graphics", "mail")
MAX_CHARS = 400
MAX_SHOTS = 3  # examples per section kept out of the rows
INSTRUCTIONS = ("Each Debian package description below is followed by the archive section "
                "the package belongs to.")
QUESTION = "Which Debian archive section is this package in?"
# name -> (examples per section, template; None: the default choice template). Every variant
# tried is here and in the results, the worse ones included.
VARIANTS = {
    "section-line-1shot": (1, "\nSection: "),
    "section-line-3shot": (3, "\nSection: "),
    "section-line-0shot": (0, "\nSection: "),
    "question-answer-1shot": (1, None),
    "labels-listed-1shot": (1, "\nOptions: {labels}\nSection: "),
}
FIGURES = ("accuracy", "macro_f1", "log_loss", "brier", "ece", "accepted_share", "threshold")


def _read_list(path: str):
    """The paragraphs of an apt list file (compressed as apt stored it)."""
    from debian.deb822 import Deb822

    text = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", path], check=True,
                          capture_output=True, text=True).stdout
    return Deb822.iter_paragraphs(text.splitlines(keepends=True))


def _document(description: str) -> str:
    """A description's synopsis and first paragraph, as plain text, cut at a word."""
    first, *rest = description.split("\n")
    body = []
    for line in rest:
        line = line.strip()
        if line == ".":
            break
        body.append(line)
    text = first.strip() + (". " + " ".join(body) if body else "")
    if len(text) > MAX_CHARS:
        text = text[:MAX_CHARS].rsplit(" ", 1)[0] + " ..."
    return text


def read_packages(lists: str = "/var/lib/apt/lists") -> list[dict]:
    """One ``{"package", "section", "text"}`` per source package of :data:`SECTIONS`."""
    found = sorted(glob.glob(f"{lists}/*_dists_*_main_binary-*_Packages*"))
    if not found:
        sys.exit(f"no Packages list under {lists}: run apt-get update")
    packages = max(found, key=os.path.getsize)  # the release's list, not its updates'
    long = {}
    for tr in glob.glob(packages.split("_binary-")[0] + "_i18n_Translation-en*"):
        for p in _read_list(tr):
            long[(p["Package"], p["Description-md5"])] = p["Description-en"]
    out, seen = [], set()
    for p in _read_list(packages):
        section, source = p.get("Section", ""), p.get("Source", p["Package"]).split()[0]
        if section not in SECTIONS or source in seen:
            continue
        seen.add(source)
        text = long.get((p["Package"], p.get("Description-md5")), p.get("Description", ""))
        out.append({"package": p["Package"], "section": section, "text": _document(text)})
    return out


def build(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    by_section = {s: [] for s in SECTIONS}
    for p in read_packages():
        by_section[p["section"]].append(p)
    per = min(args.per_section or 10**9, *(len(v) - MAX_SHOTS for v in by_section.values()))
    rows, examples = [], {}
    for section in SECTIONS:
        picked = rng.sample(by_section[section], per + MAX_SHOTS)
        examples[section] = [p["text"] for p in picked[:MAX_SHOTS]]
        rows += [{"id": p["package"], "prompt": p["text"], "section": section}
                 for p in picked[MAX_SHOTS:]]
    rng.shuffle(rows)
    with open(args.output, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    with open(args.examples_out, "w", encoding="utf-8") as f:
        json.dump(examples, f, indent=1, ensure_ascii=False)
    print(f"{len(rows)} rows ({per} per section) -> {args.output}; {MAX_SHOTS} examples per "
          f"section -> {args.examples_out}")


def variant_questions(name: str, examples: dict[str, list[str]], seed: int = 0) -> dict:
    """The question set (its JSON value) of prompt variant ``name``: the instructions, its
    worked examples (shuffled with ``seed``), one choice question."""
    shots, template = VARIANTS[name]
    q = Question("section", "choice", SECTIONS, QUESTION, template)
    worked = [(text, {"section": s}) for s in SECTIONS for text in examples[s][:shots]]
    random.Random(seed).shuffle(worked)
    preamble = few_shot_preamble(worked, QuestionSet((q,)), INSTRUCTIONS)
    question = {"name": "section", "type": "choice", "labels": list(SECTIONS),
                "question": QUESTION, "gold_field": "section"}
    if template is not None:
        question["template"] = template
    return {"preamble": preamble, "questions": [question]}


def score(llm, rows: list[dict], questions: dict, permute: bool) -> dict:
    """Every row's and content-free document's label log-probabilities, through
    ``LLM.annotate``; the seconds it took."""
    start = time.perf_counter()
    outs = llm.annotate(rows, questions, permute_labels=permute)
    seconds = time.perf_counter() - start
    bad = [o.error for o in outs if o.error]
    if bad:
        sys.exit(f"{len(bad)} rows failed: {bad[0]}")
    cf_outs = content_free(llm, questions)
    logprobs = [[o.outputs["section"].logprobs[c] for c in SECTIONS] for o in outs]
    out = {"seconds": seconds, "logprobs": logprobs, "content_free_logprobs": cf_outs,
           "outside_prob_mean": float(np.mean([o.outputs["section"].outside_prob
                                               for o in outs]))}
    if permute:
        out["permuted_label"] = [o.outputs["section"].permuted_label for o in outs]
        out["label"] = [o.outputs["section"].label for o in outs]
    return out


def content_free(llm, questions: dict) -> list[list[float]]:
    """The question's label log-probabilities on the content-free documents, as the
    calibration command scores them (the engine's question group, no row check: the empty
    document is one of them)."""
    from mlxpa.batch.calibrate import content_free_scores
    from mlxpa.data import InputOptions
    from mlxpa.entrypoints.annotate import question_set

    qs = question_set(questions)
    return content_free_scores(llm.llm_engine, qs, False, InputOptions())["section"].tolist()


def splits(entry: dict, gold: np.ndarray, seeds: int, holdout: float, budget: float) -> dict:
    """Per split seed: the held-out figures raw, with a temperature, with bias + temperature;
    then their mean and standard deviation."""
    q = Question("section", "choice", SECTIONS)
    qs, x = QuestionSet((q,)), np.asarray(entry["logprobs"])
    cf = np.asarray(entry["content_free_logprobs"])
    per_seed = []
    for seed in range(seeds):
        t = calibrate(qs, {"section": x}, {"section": gold}, seed=seed, holdout=holdout,
                      budget=budget).questions["section"]
        b = calibrate(qs, {"section": x}, {"section": gold}, seed=seed, holdout=holdout,
                      budget=budget, content_free_logprobs={"section": cf}).questions["section"]
        per_seed.append({"seed": seed, "temperature": t.temperature, "bias_temperature":
                         b.temperature, "bias": b.bias, "raw": t.before, "temp": t.after,
                         "bias+temp": b.after})
    summary = {}
    for kind in ("raw", "temp", "bias+temp"):
        summary[kind] = {}
        for f in FIGURES:
            values = [s[kind][f] for s in per_seed if s[kind][f] is not None]
            summary[kind][f] = {"mean": float(np.mean(values)) if values else None,
                                "std": float(np.std(values)) if values else None}
    for key in ("temperature", "bias_temperature"):
        values = [s[key] for s in per_seed]
        summary[key] = {"mean": float(np.mean(values)), "std": float(np.std(values))}
    return {"per_seed": per_seed, "summary": summary}


def _cell(summary: dict, f: str) -> str:
    m, s = summary[f]["mean"], summary[f]["std"]
    if m is None:
        return "-"
    if f == "accepted_share":
        return f"{m:.1%} ± {s:.1%}"
    return f"{m:.3f} ± {s:.3f}"


def table(name: str, entry: dict) -> Table:
    s = entry["splits"]["summary"]
    t = Table(title=f"{name}: held-out figures, mean ± std over {len(entry['splits']['per_seed'])}"
              f" splits (T = {s['temperature']['mean']:.2f}; bias + T = "
              f"{s['bias_temperature']['mean']:.2f})", title_justify="left")
    t.add_column("figure")
    for kind in ("raw", "temp", "bias+temp"):
        t.add_column(kind, justify="right")
    for f in FIGURES:
        t.add_row(f, *(_cell(s[k], f) for k in ("raw", "temp", "bias+temp")))
    return t


def measure(args: argparse.Namespace) -> None:
    from mlxpa import LLM

    with open(args.rows_file, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f][:args.rows or None]
    with open(args.examples, encoding="utf-8") as f:
        examples = json.load(f)
    gold = np.array([SECTIONS.index(r["section"]) for r in rows])
    report = json.load(open(args.json)) if args.json and os.path.exists(args.json) else {}
    report.update(rows=len(rows), holdout=args.holdout, seeds=args.seeds,
                  error_budget=args.error_budget, gold=gold.tolist())
    variants = report.setdefault("variants", {})
    llm, console = LLM(args.model), Console()
    for name in args.variants or VARIANTS:
        if name not in variants:
            questions = variant_questions(name, examples)
            permute = "{labels}" in (VARIANTS[name][1] or "")
            variants[name] = {"questions": questions, **score(llm, rows, questions, permute)}
        entry = variants[name]
        entry["splits"] = splits(entry, gold, args.seeds, args.holdout, args.error_budget)
        entry["all_rows_raw"] = quality(gold, calibrated_probs(entry["logprobs"]),
                                        budget=args.error_budget)
        if "permuted_label" in entry:
            changed = sum(a != b for a, b in zip(entry["label"], entry["permuted_label"]))
            entry["label_order"] = {"rows": len(rows), "changed": changed,
                                    "changed_share": changed / len(rows)}
        console.print(table(name, entry))
        if args.json:  # after each variant: a long run keeps what it scored
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(report, f)
    if args.plot:
        first = next(iter(args.variants or VARIANTS))
        s = variants[first]["splits"]["per_seed"][0]
        reliability_diagram(args.plot, {first: {"raw": s["raw"], "temperature": s["temp"],
                                                "bias+temperature": s["bias+temp"]}})


def write_questions(args: argparse.Namespace) -> None:
    with open(args.examples, encoding="utf-8") as f:
        examples = json.load(f)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(variant_questions(args.variant, examples), f, indent=1, ensure_ascii=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="the labelled JSONL and the worked examples")
    b.add_argument("-o", "--output", default="debian_sections.jsonl")
    b.add_argument("--examples-out", default="debian_sections_examples.json")
    b.add_argument("--per-section", type=int, default=None, help="default: all the smallest "
                   "section allows")
    b.add_argument("--seed", type=int, default=0)
    m = sub.add_parser("measure", help="score the rows per prompt variant, fit, report")
    m.add_argument("rows_file")
    m.add_argument("examples")
    m.add_argument("--rows", type=int, default=None)
    m.add_argument("--model", default=None)
    m.add_argument("--variants", nargs="*", default=None, choices=list(VARIANTS))
    m.add_argument("--seeds", type=int, default=10)
    m.add_argument("--holdout", type=float, default=0.75)
    m.add_argument("--error-budget", type=float, default=0.05)
    m.add_argument("--plot", default=None, help="reliability diagram PNG (first variant)")
    m.add_argument("--json", default=None, help="figures and scores as JSON (resumed: "
                   "variants already in it are not scored again)")
    q = sub.add_parser("questions", help="a prompt variant's question set, for mlxpa calibrate")
    q.add_argument("examples")
    q.add_argument("variant", choices=list(VARIANTS))
    q.add_argument("-o", "--output", default="debian_sections_questions.json")
    args = ap.parse_args()
    {"build": build, "measure": measure, "questions": write_questions}[args.cmd](args)


if __name__ == "__main__":
    main()
