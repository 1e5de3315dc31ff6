"""Constraint and logprobs fields end to end through ``mlxpa run`` (tiny model folder): every
field spelling, CLI defaults, OpenAI Batch bodies and output shapes, bad constraints named by
file, line and field before the model loads."""

from __future__ import annotations

import json
import math
import re

import jsonschema
import mlx.core as mx
import pyarrow.parquet as pq

from tests.cli.test_run_cli import invoke, read_jsonl, tiny, write_jsonl  # noqa: F401

SCHEMA = {"type": "object", "properties": {"n": {"enum": [1, 2, 3]}, "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False,
          "x-guidance": {"whitespace_flexible": False}}


def test_row_fields_every_spelling(tmp_path, tiny):  # noqa: F811
    folder, tok, _ = tiny
    src = write_jsonl(tmp_path / "in.jsonl", [
        {"prompt": "a", "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": SCHEMA, "strict": True}}},
        {"prompt": "b", "structured_outputs": {"regex": "[0-9]{4}"}},
        {"prompt": "c", "guided_choice": ["left", "right"], "logprobs": True, "top_logprobs": 2},
        {"prompt": "d", "guided_grammar": 'start: "x" ("y" | "z")'},
        {"prompt": "e", "structured_outputs": {"json": json.dumps(SCHEMA)}},
        {"prompt": "f", "response_format": {"type": "text"}, "max_tokens": 3},
        {"prompt": "g", "guided_json": SCHEMA},
    ])
    out = tmp_path / "out.jsonl"
    r = invoke([src, "-o", str(out), "--model", folder, "--max-tokens", "40",
                "--choice", "yes,no"])
    assert r.exit_code == 0, r.output
    rows = read_jsonl(out)
    for i in (0, 4, 6):
        jsonschema.validate(json.loads(rows[i]["text"]), SCHEMA)
    assert re.fullmatch("[0-9]{4}", rows[1]["text"])
    assert rows[2]["text"] in ("left", "right")
    assert set(rows[2]["choice_logprobs"]) == {"left", "right"}
    mass = {c: math.exp(v) for c, v in rows[2]["choice_logprobs"].items()}
    assert sum(mass.values()) <= 1
    for c, p in rows[2]["choice_probs"].items():  # normalised over the labels
        assert abs(p - mass[c] / sum(mass.values())) < 1e-9
    assert abs(rows[2]["choice_outside_prob"] - (1 - sum(mass.values()))) < 1e-9
    assert list(rows[2])[6:] == ["logprobs", "choice_logprobs", "choice_probs",
                                 "choice_outside_prob"]
    lps = rows[2]["logprobs"]
    assert len(lps) == rows[2]["completion_tokens"] and len(lps[0]["top_logprobs"]) == 2
    assert "".join(e["token"] for e in lps) == rows[2]["text"]
    assert re.fullmatch("x[yz]", rows[3]["text"])
    assert rows[5]["completion_tokens"] == 3 and "choice_logprobs" not in rows[5]  # text: none
    assert all(r["finish_reason"] == "stop" for i, r in enumerate(rows) if i != 5)
    assert "logprobs" not in rows[0]
    # Parquet keeps the columns
    r = invoke([src, "-o", str(tmp_path / "out.parquet"), "--model", folder,
                "--max-tokens", "40"])
    assert r.exit_code == 0, r.output
    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [t["text"] for t in table] == [r["text"] for r in rows[:5]] + [
        table[5]["text"], rows[6]["text"]]
    assert table[2]["logprobs"][0]["logprob"] == rows[2]["logprobs"][0]["logprob"]
    for column in ("choice_logprobs", "choice_probs", "choice_outside_prob"):
        assert table[2][column] == rows[2][column] and table[0][column] is None
    schema = pq.read_schema(tmp_path / "out.parquet")
    assert str(schema.field("choice_probs").type) == "struct<left: double, right: double>"
    assert str(schema.field("choice_outside_prob").type) == "double"


def test_cli_default_choice_gets_label_probabilities(tmp_path, tiny):  # noqa: F811
    folder, tok, _ = tiny
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "review one"}, {"prompt": "two"}])
    r = invoke([src, "-o", str(tmp_path / "o.jsonl"), "--model", folder,
                "--choice", "positive,negative,neutral"])
    assert r.exit_code == 0, r.output
    from mlxpa.config import EngineConfig
    from mlxpa.loader.models import load_model

    model, tok, _ = load_model(EngineConfig(model=folder))
    for row, prompt in zip(read_jsonl(tmp_path / "o.jsonl"), ["review one", "two"]):
        assert row["text"] in ("positive", "negative", "neutral")
        ids = tok.encode(prompt)
        for label, value in row["choice_logprobs"].items():
            cid = tok.encode(label, add_special_tokens=False)
            logits = model(mx.array(ids + cid)[None])[0].astype(mx.float32)
            lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            want = sum(lp[len(ids) - 1 + j, t].item() for j, t in enumerate(cid))
            assert abs(value - want) < 1e-3


def test_openai_batch_body_fields_and_output(tmp_path, tiny):  # noqa: F811
    folder, tok, _ = tiny
    src = write_jsonl(tmp_path / "batch.jsonl", [
        {"custom_id": "a", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": "hi", "max_tokens": 30, "logprobs": 2,
                  "response_format": {"type": "json_object"}}},
        {"custom_id": "b", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": "yo", "structured_outputs": {"choice": ["up", "down"]}}},
    ])
    out = tmp_path / "out.jsonl"
    r = invoke([src, "-o", str(out), "--model", folder])
    assert r.exit_code == 0, r.output
    a, b = read_jsonl(out)
    choice = a["response"]["body"]["choices"][0]
    lp = choice["logprobs"]  # a completions body: OpenAI's completions shape
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(lp["tokens"]) == a["response"]["body"]["usage"]["completion_tokens"]
    assert all(1 <= len(top) <= 2 for top in lp["top_logprobs"])
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["text"]), dict)
    bc = b["response"]["body"]["choices"][0]
    assert bc["text"] in ("up", "down") and set(bc["choice_logprobs"]) == {"up", "down"}
    assert abs(sum(bc["choice_probs"].values()) - 1) < 1e-9
    assert 0 <= bc["choice_outside_prob"] <= 1
    assert b["response"]["body"]["usage"]["completion_tokens"] == len(bc["text"])


def test_bad_constraints_stop_before_the_model_loads(tmp_path, tokenizer_only):
    src = write_jsonl(tmp_path / "in.jsonl", [
        {"prompt": "a", "guided_regex": "[a-"},
        {"prompt": "b", "response_format": {"type": "json_schema",
                                            "json_schema": {"schema": {"type": "objekt"}}}},
        {"prompt": "c", "guided_choice": "yes"},
        {"prompt": "d", "guided_regex": "a", "guided_choice": ["a"]},
        {"prompt": "e", "top_logprobs": 21},
        {"custom_id": "f", "url": "/v1/completions",
         "body": {"prompt": "f", "response_format": {"type": "xml"}}},
    ])
    # a model without weights: a load would fail
    r = invoke([src, "-o", str(tmp_path / "o.jsonl"), "--model", tokenizer_only])
    assert r.exit_code == 2
    text = " ".join(r.output.split())
    assert 'in.jsonl line 1: field "guided_regex": invalid regex' in text
    assert 'line 2: field "response_format": invalid JSON schema' in text
    assert 'line 3: field "guided_choice" must be a non-empty list' in text
    assert "line 4: give one constraint" in text
    assert 'line 5: field "top_logprobs" must be an integer from 0 to 20' in text
    assert 'line 6: field "body.response_format" must be' in text
    schema = tmp_path / "s.json"
    schema.write_text('{"type": "object", "properties": {"a": {"type": 7}}}')
    r = invoke([src, "--model", tokenizer_only, "--json-schema", str(schema)])
    text = " ".join(r.output.split())
    assert r.exit_code != 0 and "--json-schema" in text and "invalid JSON schema" in text
    r = invoke([src, "--model", tokenizer_only, "--regex", "(", "--choice", "a,b"])
    assert r.exit_code != 0 and "give one of --choice, --regex" in " ".join(r.output.split())


def test_labels_that_tokenize_the_same_stop_before_the_model_loads(tmp_path, tiny):  # noqa: F811
    """Two labels that are the same tokens after the row's prompt (the tiny tokenizer maps
    every character outside its vocabulary to one id) or the same string are refused in the
    validation pass, named by file, line and field (the CLI default by its option)."""
    folder, _, _ = tiny
    src = write_jsonl(tmp_path / "in.jsonl", [
        {"prompt": "a", "guided_choice": ["ok", "€", "™"]},
        {"prompt": "b", "structured_outputs": {"choice": ["x", "y", "x"]}},
        {"prompt": "c"},
        {"prompt": "d", "guided_choice": ["yes", "no"]},
    ])
    r = invoke([src, "-o", str(tmp_path / "o.jsonl"), "--model", folder, "--choice", "€,™"])
    assert r.exit_code == 2
    text = " ".join(r.output.split())
    assert ('in.jsonl line 1: field "guided_choice": labels "€" and "™" are the same tokens '
            "after the prompt ([0])") in text
    assert ('line 2: field "structured_outputs" must be a non-empty list of distinct '
            'non-empty strings (label "x" is given twice)') in text
    assert 'line 3: --choice: labels "€" and "™" are the same tokens' in text
    assert "line 4" not in text and "3 invalid row(s) of 4" in text


def test_grammar_tokenizer_builds_while_the_weights_load(tmp_path, tiny, monkeypatch):  # noqa: F811
    """A run with a constrained row starts llguidance's tokenizer build as soon as the
    tokenizer has loaded, before the weights, and says so when the engine has to wait for it;
    a run without constraints never builds it."""
    import time

    import mlx_lm.utils
    from typer.testing import CliRunner

    from mlxpa.cli import app
    from mlxpa.structured import matchers as structured

    folder, _, _ = tiny
    events = []
    load_weights, start, build = (mlx_lm.utils.load_model, structured.start_ll_tokenizer,
                                  structured._build_ll_tokenizer)
    monkeypatch.setattr(mlx_lm.utils, "load_model",
                        lambda *a, **k: (events.append("weights"), load_weights(*a, **k))[1])
    monkeypatch.setattr(structured, "start_ll_tokenizer",
                        lambda *a: (events.append("grammar"), start(*a))[1])
    monkeypatch.setattr(structured, "_build_ll_tokenizer",
                        lambda *a: (time.sleep(1.0), build(*a))[1])  # a slow build
    structured._LL_TOKENIZERS.clear()
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "a", "max_tokens": 3},
                                              {"prompt": "b", "guided_regex": "[0-9]{3}"}])
    r = CliRunner().invoke(app, ["run", src, "-o", str(tmp_path / "out.jsonl"), "--model",
                                 folder, "--kv-memory", "0.01"])
    assert r.exit_code == 0, r.output
    assert events[:2] == ["grammar", "weights"]
    assert "building the grammar tokenizer (llguidance, " in r.stderr
    assert re.fullmatch("[0-9]{3}", read_jsonl(tmp_path / "out.jsonl")[1]["text"])
    events.clear()
    src = write_jsonl(tmp_path / "free.jsonl", [{"prompt": "a", "max_tokens": 3}])
    r = invoke([src, "-o", str(tmp_path / "free.out.jsonl"), "--model", folder])
    assert r.exit_code == 0, r.output
    assert events == ["weights"]
