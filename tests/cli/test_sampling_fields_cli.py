"""``mlxpa run`` with the penalty, ``logit_bias`` and ``prompt_logprobs`` fields on a tiny
model: bad values are row errors naming file, line and field before the model loads; rows
run with their own settings and the CLI defaults (greedy text against mlx-lm's own logits
processors); ``prompt_logprobs`` in mlxpa rows (JSONL and Parquet) and where vLLM's OpenAI
server puts it (a chat completion's body, each completions choice), against a float64
log-softmax of mlx-lm's forward pass."""

from __future__ import annotations

import math
import re

import mlx.core as mx
import numpy as np
import pyarrow.parquet as pq
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_logits_processors

from mlxpa.config import EngineConfig
from mlxpa.loader.models import load_model
from mlxpa.sampling_params import SamplingParams, StructuredOutputsParams
from tests.cli.test_run_cli import PROMPT, invoke, read_jsonl, write_jsonl
from tests.tiny_models import save_tiny_model

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``(folder, model, tokenizer)`` of a tiny model with a chat template."""
    folder = save_tiny_model(tmp_path_factory.mktemp("m") / "tiny", chat_template=TEMPLATE)
    model, tok, _ = load_model(EngineConfig(model=folder))
    return folder, model, tok


def oracle(model, ids: list[int]) -> np.ndarray:
    logits = np.array(model(mx.array(ids)[None])[0].astype(mx.float32), dtype=np.float64)
    top = logits.max(axis=-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))


def greedy(model, ids: list[int], n: int, **processors) -> list[int]:
    return [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=n,
                                             logits_processors=make_logits_processors(
                                                 **processors))]


def test_bad_values_are_row_errors_naming_file_line_and_field(tmp_path, tiny):
    src = tmp_path / "bad.jsonl"
    src.write_text("\n".join([
        '{"prompt": "a", "repetition_penalty": NaN}',
        '{"prompt": "a", "presence_penalty": 2.5}',
        '{"prompt": "a", "frequency_penalty": "high"}',
        '{"prompt": "a", "logit_bias": {"abc": 1}}',
        '{"prompt": "a", "logit_bias": {"300": 1}}',
        '{"prompt": "a", "logit_bias": {"5": 101}}',
        '{"prompt": "a", "prompt_logprobs": -1}',
        '{"prompt": "a", "prompt_logprobs": 2, "max_tokens": 0}',
        '{"prompt": "a", "repetition_penalty": 0}',
        '{"prompt": "a", "use_beam_search": true}',
    ]) + "\n")
    r = invoke([str(src), "-o", str(tmp_path / "out.jsonl"), "--model", tiny[0]])
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    for want in [
        f'{src} line 1: field "repetition_penalty" must be a finite number > 0 (1: off), '
        "got NaN",
        f'{src} line 2: field "presence_penalty" must be a number from -2 to 2 (0: off), '
        "got 2.5",
        f'{src} line 3: field "frequency_penalty" must be a number from -2 to 2 (0: off), '
        'got "high"',
        f'{src} line 4: field "logit_bias" must be an object of token id (an integer >= 0) '
        '-> bias from -100 to 100, got {"abc": 1}',
        f'{src} line 5: field "logit_bias": token id 300 is outside the model\'s vocabulary '
        "(256 ids, 0..255)",
        f'{src} line 6: field "logit_bias" must be an object of token id (an integer >= 0) '
        '-> bias from -100 to 100, got {"5": 101}',
        f'{src} line 7: field "prompt_logprobs" must be an integer from 0 to 20 or null, '
        "got -1",
        f"{src} line 8: max_tokens must be >= 1 with prompt_logprobs",
        f'{src} line 9: field "repetition_penalty" must be a finite number > 0 (1: off), '
        "got 0",
        f'{src} line 10: field "use_beam_search" is not supported by mlxpa: beam search is '
        "not implemented",
    ]:
        assert want in text, (want, text)
    assert "10 invalid row(s) of 10" in text


def test_rows_and_defaults_run_with_their_penalties(tmp_path, tiny):
    """A row's own settings, the CLI's ``--repetition-penalty`` for rows without one, and a
    CSV ``logit_bias`` cell, each greedy text equal to mlx-lm with the same processors."""
    folder, model, tok = tiny
    ids = tok.encode(PROMPT)
    src = write_jsonl(tmp_path / "in.jsonl", [
        {"id": "own", "prompt": PROMPT, "repetition_penalty": 1.5, "ignore_eos": True},
        {"id": "default", "prompt": PROMPT, "ignore_eos": True},
        {"id": "bias", "prompt": PROMPT, "logit_bias": {"77": 100}, "ignore_eos": True},
    ])
    out = tmp_path / "out.jsonl"
    r = invoke([src, "-o", str(out), "--model", folder, "--max-tokens", "8",
                "--repetition-penalty", "3.0"])
    assert r.exit_code == 0, r.output
    got = {row["id"]: row["text"] for row in read_jsonl(out)}
    big = 10**6
    assert got["own"] == tok.decode(greedy(model, ids, 8, repetition_penalty=1.5,
                                           repetition_context_size=big))
    assert got["default"] == tok.decode(greedy(model, ids, 8, repetition_penalty=3.0,
                                               repetition_context_size=big))
    assert got["own"] != got["default"]
    assert got["bias"] == tok.decode([77] * 8)
    csv = tmp_path / "in.csv"
    csv.write_text('prompt,logit_bias,frequency_penalty,ignore_eos\n'
                   f'{PROMPT},"{{""77"": 100}}",,true\n')
    r = invoke([str(csv), "-o", str(tmp_path / "csv.jsonl"), "--model", folder,
                "--max-tokens", "3"])
    assert r.exit_code == 0, r.output
    assert read_jsonl(tmp_path / "csv.jsonl")[0]["text"] == tok.decode([77] * 3)


def check_entries(model, tok, ids, entries, top: int) -> None:
    """mlxpa's ``prompt_logprobs`` column (the ``logprobs`` column's shape, null first)."""
    ref = oracle(model, ids)
    assert len(entries) == len(ids) and entries[0] is None
    for p in range(1, len(ids)):
        row, e = ref[p - 1], entries[p]
        assert e["token"] == tok.decode([ids[p]])
        assert math.isclose(e["logprob"], row[ids[p]], abs_tol=1e-4)
        best = np.argsort(-row)[:top]
        assert [t["token"] for t in e["top_logprobs"]] == [tok.decode([b]) for b in best]
        assert all(math.isclose(t["logprob"], row[b], abs_tol=1e-4)
                   for t, b in zip(e["top_logprobs"], best))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_prompt_logprobs_column(tmp_path, tiny, fmt):
    folder, model, tok = tiny
    src = write_jsonl(tmp_path / "in.jsonl", [
        {"id": "a", "prompt": PROMPT, "prompt_logprobs": 2, "max_tokens": 2},
        {"id": "b", "prompt": PROMPT[:9], "prompt_logprobs": 0, "logprobs": True,
         "max_tokens": 2},
        {"id": "c", "prompt": PROMPT, "max_tokens": 2},
    ])
    out = tmp_path / f"out.{fmt}"
    r = invoke([src, "-o", str(out), "--model", folder, "--order", "input"])
    assert r.exit_code == 0, r.output
    rows = read_jsonl(out) if fmt == "jsonl" else pq.read_table(out).to_pylist()
    a, b, c = rows
    check_entries(model, tok, tok.encode(PROMPT), a["prompt_logprobs"], 2)
    check_entries(model, tok, tok.encode(PROMPT[:9]), b["prompt_logprobs"], 0)
    assert c.get("prompt_logprobs") is None
    if fmt == "parquet":
        column = pq.read_schema(out).field("prompt_logprobs").type
        assert str(column) == ("list<element: struct<token: string, logprob: double, "
                               "top_logprobs: list<element: struct<token: string, logprob: "
                               "double>>>>")


def test_prompt_logprobs_where_vllm_puts_them(tmp_path, tiny):
    folder, model, tok = tiny
    messages = [{"role": "user", "content": "hi there"}]
    src = write_jsonl(tmp_path / "batch.jsonl", [
        {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": messages, "max_tokens": 2, "prompt_logprobs": 1}},
        {"custom_id": "cmpl", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": PROMPT, "max_tokens": 2, "n": 2, "temperature": 1,
                  "prompt_logprobs": 1}},
    ])
    out = tmp_path / "out.jsonl"
    r = invoke([src, "-o", str(out), "--model", folder])
    assert r.exit_code == 0, r.output
    chat, cmpl = read_jsonl(out)
    body = chat["response"]["body"]
    chat_ids = tok.encode(tok.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True),
                          add_special_tokens=False)
    assert "prompt_logprobs" not in body["choices"][0]
    check_vllm(model, tok, chat_ids, body["prompt_logprobs"])
    body = cmpl["response"]["body"]
    assert "prompt_logprobs" not in body
    for choice in body["choices"]:
        check_vllm(model, tok, tok.encode(PROMPT), choice["prompt_logprobs"])


def check_vllm(model, tok, ids, got) -> None:
    """vLLM's ``[null, {"<id>": {"logprob", "rank", "decoded_token"}, ...}, ...]``: the prompt
    token first, then the most likely alternative (rank 1) unless it is the same token."""
    ref = oracle(model, ids)
    assert len(got) == len(ids) and got[0] is None
    for p in range(1, len(ids)):
        row, entry = ref[p - 1], got[p]
        best = int(np.argmax(row))
        keys = [str(ids[p])] + ([str(best)] if best != ids[p] else [])
        assert list(entry) == keys
        mine = entry[str(ids[p])]
        assert math.isclose(mine["logprob"], row[ids[p]], abs_tol=1e-4)
        assert mine["rank"] == int((row >= row[ids[p]] - 1e-6).sum())
        assert mine["decoded_token"] == tok.decode([ids[p]])
        assert entry[str(best)]["rank"] == 1
        assert math.isclose(entry[str(best)]["logprob"], row[best], abs_tol=1e-4)


def test_prompt_logprobs_on_a_choice_row_is_refused_naming_the_line(tmp_path, tiny):
    """A choice row is scored, not decoded, and computes no prompt log-probabilities: asked
    for them (its own constraint, or the --choice default), it is refused before the model
    loads instead of returning a list of nulls; other rows run."""
    src = tmp_path / "c.jsonl"
    src.write_text("\n".join([
        '{"id": "a", "prompt": "hello", "prompt_logprobs": 1, "guided_choice": ["yes", "no"]}',
        '{"id": "b", "prompt": "hello", "prompt_logprobs": 1, "max_tokens": 1}',
    ]) + "\n")
    out = tmp_path / "out.jsonl"
    want = ("prompt_logprobs is not available on a choice row (it is scored, not decoded: "
            "choice_logprobs gives each label's log-probability)")
    r = invoke([str(src), "-o", str(out), "--model", tiny[0]])
    assert r.exit_code == 2, r.output
    assert f"{src} line 1: {want}" in " ".join(r.output.split())
    src.write_text('{"id": "b", "prompt": "hello", "prompt_logprobs": 1, "max_tokens": 1}\n')
    r = invoke([str(src), "-o", str(out), "--model", tiny[0], "--choice", "yes,no"])
    assert r.exit_code == 2, r.output
    assert f"{src} line 1: {want}" in " ".join(r.output.split())
    with pytest.raises(ValueError, match=re.escape(want)):
        SamplingParams(prompt_logprobs=0, structured_outputs=StructuredOutputsParams(
            choice=["yes", "no"]))
