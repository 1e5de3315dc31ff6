"""The text workloads' prompts: seeded and deterministic, each holding its worked examples and
its row's own material (a stdlib function verbatim, the sentence a quote-qa answer quotes),
their lengths in the study's ranges on the default model's tokenizer, and the same text as
``mlxpa bench`` token ids and as ``mlxpa bench serve`` requests."""

from __future__ import annotations

import importlib
import inspect
import json
import re

import pytest

from mlxpa.bench import stdlib_text
from mlxpa.bench import text_tables as tt
from mlxpa.bench.serve_offline import offline_rows
from mlxpa.bench.serve_plan import endpoints_of
from mlxpa.bench.serve_workloads import text_requests
from mlxpa.bench.text_workloads import (
    EXTRACTION_INTRO,
    MIXES,
    TEXT_NAMES,
    TEXT_WORKLOADS,
    text_prompts,
)
from mlxpa.bench.workloads import WORKLOADS, make_workload
from mlxpa.loader.models import load_tokenizer_of
from tests.tiny_models import STRICT_TEMPLATE, save_tokenizer_only

# Prompt tokens on the default model's tokenizer: the study's ranges (a-e 170-430; f ~18).
LENGTHS = {"extraction": (170, 430), "summarise": (170, 430), "code-edit": (170, 430),
           "quote-qa": (170, 430), "labelling": (170, 430), "continue": (10, 30),
           "copy-heavy": (170, 430)}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = save_tokenizer_only(tmp_path_factory.mktemp("m") / "t", chat_template=STRICT_TEMPLATE)
    return load_tokenizer_of(folder)


@pytest.mark.parametrize("name", TEXT_NAMES)
def test_prompts_are_the_same_for_a_seed_and_differ_between_seeds(name):
    rows = text_prompts(name, 6, seed=3)
    assert rows == text_prompts(name, 6, seed=3)
    assert [r.text for r in rows] != [r.text for r in text_prompts(name, 6, seed=4)]
    assert len({r.material for r in rows}) > 1
    for r in rows:
        spec = TEXT_WORKLOADS[r.workload]
        assert (r.max_tokens, r.stop) == (spec.max_tokens, spec.stop)
        assert r.material in r.text


def _shared_prefix(texts: list[str]) -> str:
    first = texts[0]
    n = next((i for i in range(len(first)) if any(t[i:i + 1] != first[i] for t in texts)),
             len(first))
    return first[:n]


@pytest.mark.parametrize("name,cue", [("extraction", "JSON:"), ("summarise", "Summary:"),
                                      ("code-edit", "### Edited function\n"),
                                      ("quote-qa", "Answer:"), ("labelling", "Labels:")])
def test_every_row_shares_the_instructions_and_worked_examples(name, cue):
    """The few-shot part is the same for every row (a template), holds the worked examples'
    answers, and the row's material comes after it, then the cue the model answers."""
    rows = text_prompts(name, 8, seed=0)
    kind = [r for r in rows if r.text.startswith(rows[0].text[:40])]  # labelling: 2 kinds
    prefix = _shared_prefix([r.text for r in kind])
    assert prefix.count(cue.strip()) == (1 if name == "labelling" else 2)
    for r in kind:
        assert r.text.endswith(cue)
        assert r.text.index(r.material) > prefix.rindex(cue.strip())


def test_extraction_copies_every_field_from_the_e_mail():
    rows = text_prompts("extraction", 12, seed=1)
    for r in rows:
        assert r.text.startswith(EXTRACTION_INTRO) and r.text.count("JSON: {") == 2
        fields = json.loads(r.reference)
        assert list(fields) == ["name", "company", "email", "phone", "product", "quantity",
                                "colour", "town", "deliver_by"]
        for key, value in fields.items():
            assert str(value) in r.material, key
    assert len({r.material.split("\n")[1][:8] for r in rows}) > 1  # several phrasings


def test_summarise_takes_stdlib_docstring_paragraphs():
    paragraphs = {p for _, p in stdlib_text.docstring_paragraphs()}
    assert len(paragraphs) > 50
    for r in text_prompts("summarise", 8, seed=0):
        assert r.material in paragraphs and r.reference is None
        for paragraph, summary in tt.SUMMARY_SHOTS:
            assert f"Paragraph: {paragraph}\nSummary: {summary}\n\n" in r.text
        assert r.text.endswith(f"Paragraph: {r.material}\nSummary:")


def test_code_edit_holds_the_stdlib_function_verbatim():
    for r in text_prompts("code-edit", 8, seed=0):
        parameter = re.search(r"Rename the parameter `(\w+)` to `new_\1`\.\n### Function\n"
                              + re.escape(r.material) + "### Edited function\n$",
                              r.text).group(1)
        fn = next(f for f in stdlib_text.functions()
                  if f.source == r.material and f.parameter == parameter)
        module, _, attr = fn.name.rpartition(".")
        assert inspect.getsource(getattr(importlib.import_module(module), attr)) == r.material
        assert 5 <= r.material.rstrip("\n").count("\n") + 1 <= 16
        assert r.reference == fn.renamed != r.material
        assert f"new_{parameter}" in r.reference
        for source, p in tt.CODE_SHOTS:
            assert source + "### Edited function\n" + stdlib_text.rename(source, p) in r.text


def test_rename_renames_the_name_only():
    source = ("def f(x, y=2):\n    \"\"\"x is the input.\"\"\"\n    z = x.x + y  # x\n"
              "    return g(x)\n")
    assert stdlib_text.rename(source, "x") == (
        "def f(new_x, y=2):\n    \"\"\"x is the input.\"\"\"\n    z = new_x.x + y  # x\n"
        "    return g(new_x)\n")
    assert stdlib_text.rename("def f(x):\n    return g(x=x)\n", "x") is None  # keyword arg
    assert stdlib_text.rename("def f(x, y):\n    return y\n", "x") is None    # unused
    assert stdlib_text.rename("def f(self):\n    return self\n", "self") is None


def test_quote_qa_answer_quotes_a_sentence_of_its_passage():
    for r in text_prompts("quote-qa", 12, seed=2):
        sentence = re.fullmatch(r' .+\. Supporting sentence: "(.+)"', r.reference).group(1)
        assert sentence in r.material
        assert r.text.endswith(f"Passage: {r.material}\nQuestion: "
                               f"{r.text.rsplit('Question: ', 1)[1].split(chr(10))[0]}"
                               "\nAnswer:")
        assert r.text.count("Supporting sentence: ") == 2  # the two worked examples
        assert r.material.split(" is a small town")[0] in tt.TOWNS


def test_labelling_numbers_eight_items_after_four_labelled_ones():
    rows = text_prompts("labelling", 12, seed=0)
    assert {r.text.split("\n")[0] for r in rows} == {
        "Label each review as positive, negative or neutral.",
        "Label each headline as sport, business, science or politics."}
    for r in rows:
        items = r.material.split("\n")
        assert [i.split(". ")[0] for i in items] == [str(k) for k in range(1, 9)]
        labels = [line.split(". ")[1] for line in r.reference.strip("\n").split("\n")]
        assert len(labels) == 8 and set(labels) <= {*tt.SENTIMENTS, *tt.TOPICS}
        assert r.text.count("\n4. ") == 3  # four worked items, their labels, then the row's


def test_continue_is_an_opening_sentence_alone():
    for r in text_prompts("continue", 8, seed=0):
        assert r.text == r.material and r.stop == () and r.max_tokens == 96
        assert r.text.endswith(".") and "\n" not in r.text


def test_copy_heavy_interleaves_its_workloads_own_rows():
    rows = text_prompts("copy-heavy", 7, seed=5)
    parts = MIXES["copy-heavy"]
    assert [r.workload for r in rows] == [parts[i % 3] for i in range(7)]
    for k, part in enumerate(parts):
        assert rows[k::3] == text_prompts(part, 3, seed=5)[:len(rows[k::3])]


def test_bench_workloads_encode_the_text_as_run_does(tokenizer):
    """``make_workload`` tokenizes each prompt as a text row (the byte tokenizer: a token
    per character), lengths are maxima, stops per row."""
    assert set(TEXT_NAMES) <= set(WORKLOADS)
    rows = text_prompts("copy-heavy", 5, seed=1)
    wl = make_workload("copy-heavy", tokenizer, num_prompts=5, seed=1, output_len=7)
    assert wl.prompts == [tokenizer.encode(r.text) for r in rows]
    assert wl.output_lens == [r.max_tokens for r in rows]  # their own, not --output-len
    assert wl.stop == [r.stop for r in rows] and not wl.ignore_eos and not wl.exact_lengths
    head = wl.head(2, 4)
    assert head.output_lens == [4, 4] and head.stop == wl.stop[:2]


def test_serve_requests_send_the_same_text_with_stops(tokenizer):
    rows = text_prompts("summarise", 3, seed=2)
    completions = text_requests("summarise", tokenizer, num_prompts=3, seed=2)
    chat = text_requests("summarise", tokenizer, "chat", num_prompts=3, seed=2)
    for row, c, m in zip(rows, completions.requests, chat.requests):
        assert c.row == {"prompt": row.text, "max_tokens": 64, "temperature": 0.0,
                         "ignore_eos": False, "stop": ["\n\n"]}
        assert c.prompt_len == len(tokenizer.encode(row.text))
        assert m.row["messages"] == [{"role": "user", "content": row.text}]
        assert m.endpoint == "chat" and m.row["stop"] == ["\n\n"]
    assert "stop" not in text_requests("continue", tokenizer, num_prompts=1).requests[0].row
    assert completions.params["workloads"] == ["summarise"]
    # offline, the rows keep their ignore_eos: false whatever --ignore-eos says
    assert all(not r["ignore_eos"] for r in offline_rows(completions.requests, True))
    assert endpoints_of("copy-heavy", None) == ("completions",)
    assert endpoints_of("random", None) == ("chat",)
    with pytest.raises(ValueError, match="text workload must be one of"):
        text_requests("poetry", tokenizer)


@pytest.mark.real_model
def test_prompt_lengths_on_the_default_models_tokenizer(default_model_dir):
    tok = load_tokenizer_of(default_model_dir)
    for name, (low, high) in LENGTHS.items():
        lengths = [len(tok.encode(r.text)) for r in text_prompts(name, 24, seed=0)]
        assert low <= min(lengths) and max(lengths) <= high, (name, min(lengths), max(lengths))
    wl = make_workload("extraction", tok, num_prompts=2)
    assert wl.prompts[0][0] == tok.bos_token_id  # as a text row of mlxpa run: the BOS first
    assert wl.prompts[0] == tok.encode(text_prompts("extraction", 1)[0].text)
