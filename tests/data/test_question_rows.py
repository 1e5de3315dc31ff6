"""Rows asked questions: the run's question set or the row's own, gold labels (a question's
gold field, or --gold-column: a label or an object), in JSONL, Parquet and CSV (the questions
as JSON text); every problem named by file, line and field, before any model work. The
requests they become (the input processor's question group: the document is the questions'
longest common token prefix, for text and chat documents alike). Oracles: hand-written
expectations and the tokenizer's own ``encode`` / ``apply_chat_template``."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mlxpa.annotation.questions import parse_question_set
from mlxpa.annotation.render import prompt_text, question_messages
from mlxpa.batch.prompts import prompt_checker
from mlxpa.batch.requests import to_request
from mlxpa.data import read_rows
from mlxpa.data.reader_options import InputOptions
from mlxpa.data.validate import validate
from mlxpa.inputs import ChatPrompt, InputProcessor
from mlxpa.inputs.processor import question_prompts
from mlxpa.sampling_params import SamplingParams
from tests.inputs.test_processor import TEMPLATE
from tests.tiny_models import byte_tokenizer

QUESTIONS = [{"name": "topic", "type": "choice", "labels": ["tea", "ink"],
              "question": "Topic?", "gold_field": "topic_gold"},
             {"name": "spam", "type": "yes_no", "question": "Spam?"},
             {"name": "tone", "type": "choice", "labels": ["low", "mid", "top"],
              "template": "\nTone ({labels}): "}]


def _set(value=None):
    problems: list[str] = []
    qs = parse_question_set(value or {"preamble": "Tag it.", "questions": QUESTIONS}, "",
                            problems)
    assert not problems, problems
    return qs


def _jsonl(tmp_path, rows, name="in.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def tok():
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    fast = byte_tokenizer()._tokenizer
    fast.chat_template = TEMPLATE
    return TokenizerWrapper(fast, eos_token_ids={1})


def test_rows_take_the_run_set_or_their_own_with_gold_labels(tmp_path):
    qs = _set()
    own = [{"name": "q", "type": "scale", "range": [1, 3], "question": "How many?"}]
    src = _jsonl(tmp_path, [
        {"id": 1, "prompt": "doc", "topic_gold": "tea", "gold": {"spam": True}},
        {"id": 2, "prompt": "doc", "questions": own, "gold": 2},
        {"id": 3, "prompt": "doc", "gold": {"tone": " TOP "}}])
    a, b, c = read_rows(src, InputOptions(questions=qs, gold_column="gold"))
    assert (a.error, b.error, c.error) == (None, None, None)
    assert a.questions is qs and a.gold == {"topic": 0, "spam": 0}
    assert b.questions.names == ("q",) and b.gold == {"q": 1}  # the value 2 of labels 1..3
    assert c.gold == {"tone": 2}
    (plain,) = read_rows(_jsonl(tmp_path, [{"prompt": "x"}], "plain.jsonl"))
    assert plain.questions is None and plain.gold is None


def test_parquet_and_csv_rows_carry_questions(tmp_path):
    rows = [{"prompt": "doc", "questions": json.dumps(QUESTIONS[:2]), "topic_gold": "ink"}]
    (tmp_path / "in.csv").write_text(
        'prompt,questions,topic_gold,gold\ndoc,"' + json.dumps(QUESTIONS[:2]).replace('"', '""')
        + '",ink,"{""spam"": ""no""}"\n')
    (row,) = read_rows(str(tmp_path / "in.csv"), InputOptions(gold_column="gold"))
    assert row.error is None and row.questions.names == ("topic", "spam")
    assert row.gold == {"topic": 1, "spam": 1}
    pq.write_table(pa.Table.from_pylist([{**rows[0], "questions": QUESTIONS[:2]}]),
                   tmp_path / "in.parquet")
    (row,) = read_rows(str(tmp_path / "in.parquet"))  # the gold field is read too
    assert row.error is None and row.gold == {"topic": 1}


def test_problems_name_file_line_and_field(tmp_path):
    src = _jsonl(tmp_path, [
        {"prompt": "d", "questions": [{"name": "x", "type": "multi"}]},
        {"prompt": "d", "topic_gold": "coffee"},
        {"prompt": "d", "gold": {"nope": "yes"}},
        {"prompt_token_ids": [5, 6]},
        {"prompt": "d", "questions": QUESTIONS[:1], "guided_choice": ["a", "b"]},
        {"prompt": "d", "gold": "tea"}])
    v = validate(read_rows(src, InputOptions(questions=_set(), gold_column="gold")),
                 source=src, unit="line")
    assert v.problems == [
        f'{src} line 1: field "questions[0].type" must be "choice" or "yes_no" or "scale", '
        'got "multi"',
        f'{src} line 2: field "topic_gold" must be one of question "topic"\'s labels ("tea", '
        '"ink"), got "coffee"',
        f'{src} line 3: field "gold": "nope" is not a question of the row (topic, spam, tone)',
        f'{src} line 4: field "prompt_token_ids": a row asked questions needs a text "prompt" '
        'or "messages"',
        f'{src} line 5: give field "questions" or a constraint (structured_outputs, guided_*, '
        "response_format), not both",
        f'{src} line 6: field "gold" must be an object of question names to gold labels (the '
        'row is asked 2 questions), got "tea"']


def test_text_rows_become_a_question_group(tok):
    qs = _set()
    (row,) = read_rows_from([{"id": "r", "prompt": "A kettle."}], qs)
    proc = InputProcessor(tok, 256, 4096)
    req = to_request(row, SamplingParams(), proc)
    texts = [prompt_text("A kettle.", q, "Tag it.") for q in qs.questions]
    assert [list(q.prompt_token_ids) for q in req.questions] == [tok.encode(t) for t in texts]
    assert [q.labels for q in req.questions] == [("tea", "ink"), ("yes", "no"),
                                                 ("low", "mid", "top")]
    assert req.prompt_token_ids == tok.encode("Tag it.\n\nA kettle.\n")  # shared: up to "\n"
    assert req.request_id == "r" and req.sampling_params.max_tokens > 0
    permuted = to_request(row, SamplingParams(), proc, permute=True)
    assert len(permuted.questions) == 4  # tone again, its labels listed in reverse
    assert permuted.questions[3].prompt_token_ids == tok.encode(
        "Tag it.\n\nA kettle.\nTone (top, mid, low): ")


def test_chat_rows_share_the_conversation_tokens(tok):
    """Each question is a user turn rendered by the chat template; the document is what the
    renderings share (no per-template code)."""
    qs = _set()
    conv = [{"role": "user", "content": "A kettle."}]
    (row,) = read_rows_from([{"messages": conv}], qs)
    prompts, labels = question_prompts(row)
    assert prompts[0] == ChatPrompt(question_messages(conv, qs.questions[0], "Tag it."))
    req = to_request(row, SamplingParams(), InputProcessor(tok, 256, 4096))
    rendered = [tok.encode(tok.apply_chat_template(question_messages(conv, q, "Tag it."),
                                                   tokenize=False, add_generation_prompt=True),
                           add_special_tokens=False) for q in qs.questions]
    assert [list(q.prompt_token_ids) for q in req.questions] == rendered
    shared = tok.encode(tok.apply_chat_template(
        [{"role": "system", "content": "Tag it."}, {"role": "user", "content": "A kettle."}],
        tokenize=False), add_special_tokens=False)[:-1]  # up to before the turn's end
    assert req.prompt_token_ids[:len(shared)] == shared
    assert all(r[:len(req.prompt_token_ids)] == req.prompt_token_ids for r in rendered)
    assert len({r[len(req.prompt_token_ids)] for r in rendered}) > 1  # the longest


def test_pass_one_checks_each_questions_labels(tmp_path, tok):
    bad = [{"name": "x", "type": "choice", "labels": ["€", "™"], "question": "Which?"}]
    src = _jsonl(tmp_path, [{"prompt": "d", "questions": bad}, {"prompt": "d"}])
    check = prompt_checker(lambda: tok, False, None)
    v = validate(read_rows(src, InputOptions(questions=_set())), source=src, unit="line",
                 check_prompt=check)
    assert v.problems == [f'{src} line 1: field "questions[0].labels": labels "€" and "™" are '
                          "the same tokens after the prompt ([0])"]


def test_a_question_over_the_context_is_named(tok):
    (row,) = read_rows_from([{"prompt": "x" * 50}], _set())  # BOS + 9 + 50 + 26 = 86
    assert to_request(row, SamplingParams(), InputProcessor(tok, 256, 60)) == (
        "questions[0]: prompt has 86 tokens; the limit is 59 (the model context "
        "(--max-model-len) holds 60 tokens)")


def read_rows_from(rows, qs):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        return list(read_rows(_jsonl(Path(d), rows), InputOptions(questions=qs)))
