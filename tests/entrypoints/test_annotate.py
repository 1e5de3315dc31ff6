"""``LLM.annotate``: typed questions about documents, the file run's pipeline. Oracles: mlx-lm's
own forward pass (teacher forcing) over each question's text and label, the same questions
through ``mlxpa run`` (the answers written), and each error's text by hand."""

from __future__ import annotations

import json

import pytest

from mlxpa.annotation.render import prompt_text, question_messages
from mlxpa.annotation.temperature import calibrated_probs
from mlxpa.entrypoints.annotate import question_set
from mlxpa.entrypoints.outputs import AnnotationOutput, QuestionAnswer
from tests.cli.test_run_cli import invoke, read_jsonl, write_jsonl
from tests.entrypoints.conftest import KV_BYTES
from tests.tiny_models import teacher_forced

QUESTIONS = {"preamble": "Tag each note.", "questions": [
    {"name": "topic", "type": "choice", "labels": ["tea", "ink"], "question": "Topic?"},
    {"name": "stars", "type": "scale", "range": [1, 3], "question": "Stars?"}]}
DOCS = ["A pot of green tea.", "Ink on the page.", "Tea and ink."]



def test_answers_equal_teacher_forcing_for_texts_and_conversations(llm, mlx_lm_model):
    model, tok = mlx_lm_model
    qs = question_set(QUESTIONS)
    conv = [{"role": "user", "content": "Sky."}]
    outs = llm.annotate([*DOCS, conv], QUESTIONS, use_tqdm=False)
    assert [type(o) for o in outs] == [AnnotationOutput] * 4
    assert [o.request_id for o in outs] == ["0", "1", "2", "3"]
    for o, doc in zip(outs, [*DOCS, conv]):
        assert o.error is None and list(o.outputs) == ["topic", "stars"]
        for q in qs.questions:
            if isinstance(doc, str):
                ids = tok.encode(prompt_text(doc, q, qs.preamble))
            else:
                ids = tok.encode(tok.apply_chat_template(question_messages(doc, q, qs.preamble),
                                                         tokenize=False,
                                                         add_generation_prompt=True),
                                 add_special_tokens=False)
            want = teacher_forced(model, tok, ids, q.labels)
            a = o.outputs[q.name]
            assert isinstance(a, QuestionAnswer) and not a.calibrated
            assert list(a.logprobs.values()) == pytest.approx(want, abs=1e-3)
            assert a.label == q.labels[max(range(len(want)), key=want.__getitem__)]
        stars = o.outputs["stars"]
        assert stars.expected == pytest.approx(sum(p * v for p, v in zip(
            stars.probs.values(), (1, 2, 3))))
        assert o.outputs["topic"].expected is None and o.label_order_changed is None
    assert outs[0].prompt == DOCS[0] and outs[3].prompt is None


def test_annotate_equals_the_file_run(folder, tmp_path):
    """A fresh ``LLM`` (an empty prefix cache, as the file run's) answers as the file run
    does, to the last bit of each probability."""
    from mlxpa import LLM

    llm = LLM(folder, kv_cache_memory_bytes=KV_BYTES)
    q = tmp_path / "q.json"
    q.write_text(json.dumps(QUESTIONS))
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"format": "mlxpa-calibration", "version": 1, "questions": {
        "topic": {"labels": ["tea", "ink"], "temperature": 3.0, "bias": None}}}))
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": f"d{i}", "prompt": d}
                                              for i, d in enumerate(DOCS)])
    out = tmp_path / "out.jsonl"
    r = invoke([src, "-o", str(out), "--model", folder, "--questions", str(q),
                "--calibration", str(cal), "--permute-labels"])
    assert r.exit_code == 0, r.output
    rows = read_jsonl(out)
    got = llm.annotate([{"id": f"d{i}", "prompt": d} for i, d in enumerate(DOCS)], str(q),
                       calibration=str(cal), permute_labels=True, use_tqdm=False)
    for o, row in zip(got, rows):
        assert o.request_id == row["id"] and o.label_order_changed == row["label_order_changed"]
        for name, a in o.outputs.items():
            w = row["answers"][name]
            assert a.probs == pytest.approx(w["probs"], abs=1e-9)
            assert a.logprobs == pytest.approx(w["logprobs"], abs=1e-9)
            assert (a.label, a.calibrated, a.permuted_label) == (
                w["label"], w["calibrated"], w.get("permuted_label"))
        t = o.outputs["topic"]
        assert list(t.probs.values()) == pytest.approx(
            calibrated_probs(list(t.logprobs.values()), 3.0).tolist())


def test_documents_with_their_own_questions_and_errors(llm):
    own = {"id": "x", "prompt": "Tea.", "questions": QUESTIONS["questions"][:1]}
    (o,) = llm.annotate(own, use_tqdm=False)
    assert list(o.outputs) == ["topic"] and o.request_id == "x"
    with pytest.raises(ValueError, match=r'documents\[0\]: no questions \(give questions='):
        llm.annotate("Tea.", use_tqdm=False)
    with pytest.raises(ValueError, match=r'documents\[1\]: field "questions\[0\].type" must '
                                         r'be "choice" or "yes_no" or "scale", got "multi"'):
        llm.annotate(["ok", {"prompt": "x", "questions": [{"name": "q", "type": "multi"}]}],
                     QUESTIONS, use_tqdm=False)
    with pytest.raises(ValueError, match=r'documents\[1\]: duplicate id "a"'):
        llm.annotate([{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y"}], QUESTIONS,
                     use_tqdm=False)
    with pytest.raises(ValueError, match=r'field "questions\[0\].labels" must be a list'):
        llm.annotate("Tea.", [{"name": "q", "type": "choice", "labels": ["a"]}])
    with pytest.raises(TypeError, match="questions must be a path"):
        llm.annotate("Tea.", 3)
    with pytest.raises(TypeError, match=r"documents\[0\]: expected a text"):
        llm.annotate([5], QUESTIONS)
