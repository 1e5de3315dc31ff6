"""Questions over each row's document through ``mlxpa run`` and ``mlxpa calibrate`` (a tiny
model folder). Oracles: the same questions as separate choice rows of ``mlxpa run``;
scikit-learn's accuracy, macro-F1, kappa and confusion matrix on the written answers; a
float64 grid search of the temperature and the content-free bias computed by hand from mlx-lm's
own forward pass (teacher forcing)."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import accuracy_score, cohen_kappa_score, confusion_matrix, f1_score

from mlxpa.annotation.questions import load_questions
from mlxpa.annotation.render import prompt_text
from mlxpa.annotation.temperature import (
    CONTENT_FREE,
    TEMPERATURE_BOUNDS,
    calibrated_probs,
    split_rows,
)
from mlxpa.config import EngineConfig
from mlxpa.loader.models import load_model
from tests.cli.helpers import cli
from tests.cli.test_run_cli import invoke, read_jsonl, write_jsonl
from tests.tiny_models import save_tiny_model, teacher_forced

QUESTIONS = {"preamble": "Tag each note.", "questions": [
    {"name": "topic", "type": "choice", "labels": ["tea", "ink", "sky"], "question": "Topic?",
     "gold_field": "topic_gold"},
    {"name": "spam", "type": "yes_no", "question": "Spam?"},
    {"name": "tone", "type": "choice", "labels": ["low", "mid", "top"],
     "template": "\nTone ({labels}): "}]}
WORDS = ["tea pot", "ink well", "blue sky", "green tea", "ink pen", "sky high", "black ink"]


def run(args):
    return invoke([str(a) for a in args])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


@pytest.fixture()
def files(tmp_path):
    q = tmp_path / "q.json"
    q.write_text(json.dumps(QUESTIONS))
    rng = np.random.default_rng(0)
    rows = [{"id": f"r{i}", "prompt": f"Note {i}: {WORDS[i % 7]} and {WORDS[(3 * i) % 7]}.",
             "topic_gold": ["tea", "ink", "sky"][int(rng.integers(3))],
             "gold": {"spam": bool(rng.integers(2))}} for i in range(24)]
    return str(q), write_jsonl(tmp_path / "in.jsonl", rows), rows


def test_answers_equal_separate_choice_rows_in_every_format(tmp_path, tiny, files):
    q, src, rows = files
    out = tmp_path / "out.jsonl"
    r = run([src, "-o", out, "--model", tiny, "--questions", q])
    assert r.exit_code == 0, r.output
    got = read_jsonl(out)
    assert [g["id"] for g in got] == [row["id"] for row in rows]  # one row per row, in order
    qs = load_questions(q)
    choice = [{"id": f"{row['id']}/{x.name}", "prompt": prompt_text(row["prompt"], x,
                                                                   qs.preamble),
               "structured_outputs": {"choice": list(x.labels)}}
              for row in rows for x in qs.questions]
    r = run([write_jsonl(tmp_path / "choice.jsonl", choice), "-o", tmp_path / "c.jsonl",
                "--model", tiny])
    assert r.exit_code == 0, r.output
    want = {c["id"]: c for c in read_jsonl(tmp_path / "c.jsonl")}
    for g in got:
        assert g["completion_tokens"] == 0 and g["text"] == "" and "error" not in g
        assert list(g["answers"]) == ["topic", "spam", "tone"]
        for name, a in g["answers"].items():
            c = want[f"{g['id']}/{name}"]
            assert a["logprobs"] == pytest.approx(c["choice_logprobs"], abs=1e-5)
            assert a["probs"] == pytest.approx(c["choice_probs"], abs=1e-6)
            assert a["outside_prob"] == pytest.approx(c["choice_outside_prob"], abs=1e-6)
            assert a["label"] == max(a["probs"], key=a["probs"].get) == c["text"]
            assert a["calibrated"] is False
    r = run([src, "-o", tmp_path / "out.parquet", "--model", tiny, "--questions", q])
    assert r.exit_code == 0, r.output
    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert table[3]["answers"]["spam"]["label"] == got[3]["answers"]["spam"]["label"]
    assert table[3]["answers"]["topic"]["probs"] == pytest.approx(
        got[3]["answers"]["topic"]["probs"])
    csv = tmp_path / "in.csv"  # the questions field as JSON text, per row
    csv.write_text('id,prompt,questions\nc1,Note: tea,"'
                   + json.dumps(QUESTIONS["questions"][1:2]).replace('"', '""') + '"\n')
    r = run([str(csv), "-o", str(tmp_path / "csv.jsonl"), "--model", tiny])
    assert r.exit_code == 0, r.output
    (row,) = read_jsonl(tmp_path / "csv.jsonl")
    assert list(row["answers"]) == ["spam"]


def test_gold_figures_match_scikit_learn(tmp_path, tiny, files):
    q, src, rows = files
    out, metrics = tmp_path / "out.jsonl", tmp_path / "m.json"
    r = run([src, "-o", out, "--model", tiny, "--questions", q, "--gold-column", "gold",
                "--metrics-json", metrics])
    assert r.exit_code == 0, r.output
    got = read_jsonl(out)
    figures = json.loads(metrics.read_text())["annotation"]["questions"]
    assert sorted(figures) == ["spam", "topic"]  # tone has no gold
    for name, labels, gold in (
            ("topic", ["tea", "ink", "sky"], [row["topic_gold"] for row in rows]),
            ("spam", ["yes", "no"], ["yes" if row["gold"]["spam"] else "no" for row in rows])):
        pred = [g["answers"][name]["label"] for g in got]
        f = figures[name]
        assert f["n"] == len(rows)
        assert f["accuracy"] == pytest.approx(accuracy_score(gold, pred))
        assert f["macro_f1"] == pytest.approx(f1_score(gold, pred, average="macro"))
        kappa = cohen_kappa_score(gold, pred, labels=labels)
        assert f["kappa"] == (None if math.isnan(kappa) else pytest.approx(kappa))
        assert f["confusion_matrix"] == confusion_matrix(gold, pred, labels=labels).tolist()
    r = cli("run", src, "-o", out, "--overwrite", "--model", tiny, "--questions", q,
            "--gold-column", "gold", "--kv-memory", "0.01")  # the report, not quiet
    assert r.exit_code == 0, r.output
    assert "topic: answers against gold labels" in r.stderr
    assert "spam: answers against gold labels" in r.stderr and "accepted at 5% errors" in r.stderr


def test_calibration_and_the_label_order_check(tmp_path, tiny, files):
    q, src, rows = files
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"format": "mlxpa-calibration", "version": 1, "questions": {
        "topic": {"labels": ["tea", "ink", "sky"], "temperature": 2.5,
                  "bias": {"tea": -0.5, "ink": -1.0, "sky": -2.0}}}}))
    out = tmp_path / "out.jsonl"
    r = run([src, "-o", out, "--model", tiny, "--questions", q, "--calibration", cal,
                "--permute-labels", "--metrics-json", tmp_path / "m.json"])
    assert r.exit_code == 0, r.output
    for g in read_jsonl(out):
        a = g["answers"]["topic"]
        want = calibrated_probs([a["logprobs"][c] for c in ("tea", "ink", "sky")], 2.5,
                                [-0.5, -1.0, -2.0])
        assert list(a["probs"].values()) == pytest.approx(want.tolist(), abs=1e-12)
        assert a["calibrated"] and not g["answers"]["spam"]["calibrated"]
        tone = g["answers"]["tone"]
        assert tone["permuted_label"] in ("low", "mid", "top")
        assert "permuted_label" not in a  # the topic template does not list its labels
        assert g["label_order_changed"] == (["tone"] if tone["permuted_label"] != tone["label"]
                                            else [])
    order = json.loads((tmp_path / "m.json").read_text())["annotation"]["label_order"]
    changed = sum(bool(g["label_order_changed"]) for g in read_jsonl(out))
    assert order["rows"] == len(rows) and order["changed_rows"] == changed


def test_option_and_file_problems_are_one_line_usage_errors(tmp_path, tiny, files):
    q, src, _ = files
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"name": "x", "type": "yes_no", "labels": ["y", "n", "m"]}]))
    r = run([src, "-o", tmp_path / "o.jsonl", "--model", tiny, "--questions", bad])
    assert r.exit_code == 2
    assert (f'{bad}: field "questions[0].labels" must be a list of exactly 2 distinct '
            'non-empty strings, got ["y", "n", "m"]') in r.output
    r = run([src, "-o", tmp_path / "o.jsonl", "--model", tiny, "--questions", q,
                "--choice", "a,b"])
    assert r.exit_code == 2 and "--questions scores labels itself" in r.output
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"format": "mlxpa-calibration", "version": 1, "questions": {
        "topic": {"labels": ["tea", "sky", "ink"], "temperature": 1.0}}}))
    r = run([src, "-o", tmp_path / "o.jsonl", "--model", tiny, "--questions", q,
                "--calibration", cal])
    assert r.exit_code == 2 and 'field "questions.topic.labels"' in r.output


def grid_loss(x: np.ndarray, gold: np.ndarray, t: float) -> float:
    """Mean log loss of ``softmax(x / t)`` at the gold labels (float64)."""
    z = x / t
    z = z - z.max(axis=1, keepdims=True)
    return -np.mean(z[np.arange(len(gold)), gold] - np.log(np.exp(z).sum(axis=1)))



def test_calibrate_fits_what_a_grid_search_and_the_model_say(tmp_path, tiny, files):
    q, src, rows = files
    cal, png, scores = tmp_path / "cal.json", tmp_path / "rel.png", tmp_path / "scores.jsonl"
    r = cli("calibrate", src, "--questions", q, "-o", cal, "--model", tiny, "--gold-column",
            "gold", "--content-free", "--holdout", "0.5", "--seed", "3",
            "--reliability-png", png, "--scores-output", scores, "--kv-memory", "0.01", "-q")
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fitted = json.loads(cal.read_text())
    assert fitted["seed"] == 3 and fitted["content_free"] == list(CONTENT_FREE)
    assert sorted(fitted["questions"]) == ["spam", "topic"]
    model, tok, _ = load_model(EngineConfig(model=tiny))
    qs = load_questions(q)
    answers = {g["id"]: g["answers"] for g in read_jsonl(scores)}
    held = split_rows(len(rows), 0.5, 3)
    for name, gold in (("topic", [["tea", "ink", "sky"].index(r["topic_gold"]) for r in rows]),
                       ("spam", [0 if r["gold"]["spam"] else 1 for r in rows])):
        question, entry = qs[name], fitted["questions"][name]
        cf = np.array([teacher_forced(model, tok,
                                      tok.encode(prompt_text(d, question, qs.preamble)),
                                      question.labels) for d in CONTENT_FREE])
        p_cf = np.exp(cf) / np.exp(cf).sum(axis=1, keepdims=True)
        bias = np.log(p_cf.mean(axis=0))
        assert [entry["bias"][c] for c in question.labels] == pytest.approx(bias, abs=1e-4)
        x = np.array([[answers[r["id"]][name]["logprobs"][c] for c in question.labels]
                      for r in rows]) - bias
        g, fit = np.array(gold), ~held
        grid = np.exp(np.linspace(*np.log(TEMPERATURE_BOUNDS), 20001))
        best = grid[np.argmin([grid_loss(x[fit], g[fit], t) for t in grid])]
        assert entry["temperature"] == pytest.approx(best, rel=2e-3)
        assert entry["num_fit"] == fit.sum() and entry["num_heldout"] == held.sum()
        assert entry["after"]["n"] == held.sum()
    assert 0.02 < fitted["questions"]["spam"]["temperature"] < 99  # inside the search bounds
    assert "T = " in r.output and "wrote" in r.output


def test_resume_keeps_the_answered_rows(tmp_path, tiny, files):
    """A resumed run skips the rows whose answers the output holds (one record each) and
    answers the rest, in input order, as a fresh run does."""
    q, src, rows = files
    first = write_jsonl(tmp_path / "first.jsonl", rows[:5])
    out = tmp_path / "out.jsonl"
    assert run([first, "-o", out, "--model", tiny, "--questions", q]).exit_code == 0
    r = run([src, "-o", out, "--model", tiny, "--questions", q, "--resume",
             "--metrics-json", tmp_path / "m.json"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "m.json").read_text())["requests"] == len(rows) - 5
    fresh = tmp_path / "fresh.jsonl"
    assert run([src, "-o", fresh, "--model", tiny, "--questions", q]).exit_code == 0
    got, want = read_jsonl(out), read_jsonl(fresh)
    assert [g["id"] for g in got] == [row["id"] for row in rows]
    for g, w in zip(got, want):
        assert {n: a["label"] for n, a in g["answers"].items()} == {
            n: a["label"] for n, a in w["answers"].items()}


def test_a_row_constraint_under_the_runs_questions_is_refused(tmp_path, tiny, files):
    q, _, _ = files
    src = write_jsonl(tmp_path / "c.jsonl", [
        {"prompt": "Note: tea."},
        {"prompt": "Note: ink.", "structured_outputs": {"choice": ["a"]}}])
    r = run([src, "-o", tmp_path / "out.jsonl", "--model", tiny, "--questions", q])
    assert r.exit_code != 0
    assert "line 2: a row asked the run's questions (--questions) takes no constraint" in r.output


def _without_gold_field(tmp_path) -> str:
    q = tmp_path / "q_no_gold.json"
    q.write_text(json.dumps({**QUESTIONS, "questions": [
        {k: v for k, v in x.items() if k != "gold_field"} for x in QUESTIONS["questions"]]}))
    return str(q)


def test_calibrate_without_gold_stops_before_the_model_loads(tmp_path, tiny, files):
    _, src, _ = files
    q = _without_gold_field(tmp_path)
    r = cli("calibrate", src, "--questions", q, "-o", tmp_path / "cal.json", "--model", tiny,
            "--kv-memory", "0.01")
    assert r.exit_code == 1
    assert "no row has a gold label for a question of the set" in r.output
    assert "Loading the model" not in r.output and not (tmp_path / "cal.json").exists()


def test_reports_warn_of_a_gold_column_no_row_has_and_of_few_fitting_rows(tmp_path, tiny, files):
    q, src, _ = files
    r = cli("run", src, "-o", tmp_path / "out.jsonl", "--model", tiny, "--questions",
            _without_gold_field(tmp_path),
            "--gold-column", "nosuch", "--kv-memory", "0.01")
    assert r.exit_code == 0, r.output
    assert 'no row has a gold label in the field "nosuch"' in " ".join(r.output.split())
    r = cli("calibrate", src, "--questions", q, "-o", tmp_path / "cal.json", "--model", tiny,
            "--gold-column", "gold", "--kv-memory", "0.01")
    assert r.exit_code == 0, r.output
    assert "fitted on 12 rows" in r.output and "warning: few rows" in r.output


def test_calibrate_says_each_thing_once_and_counts_the_rows(tmp_path, tiny, files):
    q, src, rows = files
    r = cli("calibrate", src, "--questions", q, "-o", tmp_path / "cal.json", "--model", tiny,
            "--gold-column", "gold", "--content-free", "--kv-memory", "0.01")
    assert r.exit_code == 0, r.output
    assert r.output.count("checking every row before the model loads") == 1
    assert "row(s) to" not in r.output  # no temporary scores file named
    assert f"requests              {len(rows)}" in r.output  # the rows, not the documents
    assert "3 content-free documents" in r.output
    assert "KV pool:" in r.output and "GiB" not in r.output.split("KV pool:")[1].split("\n")[0]
