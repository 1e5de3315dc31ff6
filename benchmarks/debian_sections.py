"""A labelled data set for annotation and calibration: Debian package descriptions and their
archive section, read offline from this machine's apt lists, and a check of the default model
on it with today's choice rows.

  python benchmarks/debian_sections.py build -o debian.jsonl --questions-out debian_q.json
  python benchmarks/debian_sections.py check debian.jsonl debian_q.json --rows 100

``build`` reads the ``Packages`` index of the largest ``*_main_binary-*_Packages*`` list under
/var/lib/apt/lists (``apt-get update`` fills it; the long descriptions come from the
``Translation-en`` list next to it when apt fetched one: ``apt-get update -o
Acquire::Languages=en``), keeps one package per source package (binary packages of one source
repeat their text), and draws the same number of packages from each of :data:`SECTIONS` with a
fixed seed. A document is the package's description (its first paragraph after the synopsis,
at most :data:`MAX_CHARS` characters); the gold label is its section. A few packages of each
section, kept out of the rows, are the worked examples of the question set's preamble.

``check`` scores the first ``--rows`` rows with ``mlxpa run`` (one choice row per question,
:mod:`mlxpa.annotation.choice_rows`), prints the quality figures of the raw label
probabilities, and, with ``--calibrate``, fits a temperature on half of them and reports the
other half before and after (also with contextual calibration's bias from content-free rows).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np
from rich.console import Console

from mlxpa.annotation.calibration import calibrate
from mlxpa.annotation.choice_rows import answers_from_records, choice_rows, question_row
from mlxpa.annotation.gold import row_gold
from mlxpa.annotation.metrics import quality
from mlxpa.annotation.questions import Question, QuestionSet, load_questions
from mlxpa.annotation.render import few_shot_preamble
from mlxpa.annotation.report import calibration_tables, figures_table, reliability_diagram
from mlxpa.annotation.temperature import CONTENT_FREE

# Frequent sections whose packages a reader tells apart by their description.
SECTIONS = ("games", "science", "fonts", "sound", "graphics", "mail")
MAX_CHARS = 400
# The question follows the document as one line: "Section: <label>". Listing the labels (or
# asking "Question: ... Answer:") made the default model answer far worse (docs/annotation.md).
TEMPLATE = "\nSection: "
INSTRUCTIONS = ("Each Debian package description below is followed by the archive section "
                "the package belongs to.")


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
    per = min(args.per_section, *(len(v) - args.shots for v in by_section.values()))
    rows, examples = [], []
    for section in SECTIONS:
        picked = rng.sample(by_section[section], per + args.shots)
        examples += [(p["text"], {"section": section}) for p in picked[:args.shots]]
        rows += [{"id": p["package"], "prompt": p["text"], "section": section}
                 for p in picked[args.shots:]]
    rng.shuffle(rows)
    rng.shuffle(examples)
    question = Question("section", "choice", SECTIONS, template=TEMPLATE, gold_field="section")
    preamble = few_shot_preamble(examples, QuestionSet((question,)), INSTRUCTIONS)
    spec = {"preamble": preamble, "questions": [
        {"name": "section", "type": "choice", "labels": list(SECTIONS), "template": TEMPLATE,
         "gold_field": "section"}]}
    with open(args.output, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    with open(args.questions_out, "w", encoding="utf-8") as f:
        json.dump(spec, f, indent=2, ensure_ascii=False)
    print(f"{len(rows)} rows ({per} per section) -> {args.output}; "
          f"{len(examples)} examples in the preamble -> {args.questions_out}")


def _score(rows: list[dict], model: str | None, out_dir: str) -> list[dict]:
    """Run ``rows`` (choice rows) through ``mlxpa run``; its result records."""
    src, dst = os.path.join(out_dir, "in.jsonl"), os.path.join(out_dir, "out.jsonl")
    with open(src, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    cmd = [sys.executable, "-m", "mlxpa", "run", src, "-o", dst, "--overwrite"]
    subprocess.run(cmd + (["--model", model] if model else []), check=True)
    with open(dst, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def check(args: argparse.Namespace) -> None:
    questions = load_questions(args.questions)
    with open(args.rows_file, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f][:args.rows]
    cf_rows = [question_row(doc, q, questions.preamble, f"content-free-{i}")
               for i, doc in enumerate(CONTENT_FREE) for q in questions.questions]
    with tempfile.TemporaryDirectory() as tmp:
        records = _score([r for i, row in enumerate(rows) for r in choice_rows(row, questions,
                                                                               index=i)]
                         + cf_rows, args.model, tmp)
    answers = answers_from_records(records, questions)
    report: dict = {"rows": len(rows), "questions": {}}
    console = Console()
    for q in questions.questions:
        gold = np.array([row_gold(r, questions, None, []).get(q.name, -1) for r in rows])
        logprobs = np.array([list(answers[str(r["id"])][q.name]["logprobs"].values())
                             for r in rows])
        cf = np.array([list(answers[f"content-free-{i}"][q.name]["logprobs"].values())
                       for i in range(len(CONTENT_FREE))])
        raw = quality(gold, np.exp(logprobs) / np.exp(logprobs).sum(1, keepdims=True),
                      budget=args.error_budget)
        console.print(figures_table(f"{q.name}: raw label probabilities, {len(rows)} rows",
                                    {"raw": raw}))
        entry = {"raw": raw, "logprobs": logprobs.tolist(), "gold": gold.tolist(),
                 "content_free_logprobs": cf.tolist(),
                 "outside_prob_mean": float(np.mean([answers[str(r["id"])][q.name][
                     "outside_prob"] for r in rows]))}
        if args.calibrate:
            for name, cfl in (("temperature", None), ("bias+temperature", {q.name: cf})):
                cal = calibrate(QuestionSet((q,)), {q.name: logprobs}, {q.name: gold},
                                content_free_logprobs=cfl, seed=args.seed,
                                budget=args.error_budget)
                for table in calibration_tables(cal):
                    console.print(table)
                c = cal.questions[q.name]
                entry[name] = {"temperature": c.temperature, "bias": c.bias,
                               "before": c.before, "after": c.after}
            if args.plot:
                reliability_diagram(args.plot, {q.name: {
                    "raw": entry["temperature"]["before"],
                    "temperature": entry["temperature"]["after"],
                    "bias+temperature": entry["bias+temperature"]["after"]}})
        report["questions"][q.name] = entry
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="the labelled JSONL and its question set")
    b.add_argument("-o", "--output", default="debian_sections.jsonl")
    b.add_argument("--questions-out", default="debian_sections_questions.json")
    b.add_argument("--per-section", type=int, default=200)
    b.add_argument("--shots", type=int, default=1, help="examples per section")
    b.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("check", help="score rows with the model, report the figures")
    c.add_argument("rows_file")
    c.add_argument("questions")
    c.add_argument("--rows", type=int, default=100)
    c.add_argument("--model", default=None)
    c.add_argument("--error-budget", type=float, default=0.05)
    c.add_argument("--calibrate", action="store_true")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--plot", default=None, help="reliability diagram PNG (with --calibrate)")
    c.add_argument("--json", default=None, help="figures and scores as JSON")
    args = ap.parse_args()
    build(args) if args.cmd == "build" else check(args)


if __name__ == "__main__":
    main()
