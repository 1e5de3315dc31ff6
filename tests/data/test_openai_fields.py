"""OpenAI Batch bodies and plain rows read as OpenAI and vLLM read them: their field rules
(``max_completion_tokens or max_tokens``), restated defaults accepted, features that change
the output refused by name, ``n`` bounded."""

from __future__ import annotations

import json

import pytest

from mlxpa.data import read_rows


def _body(**body) -> dict:
    return {"custom_id": "q", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **body}}



def _one(tmp_path, obj):
    src = tmp_path / "b.jsonl"
    src.write_text(json.dumps(obj) + "\n")
    (row,) = read_rows(str(src))
    return row



def test_max_completion_tokens_wins_over_max_tokens(tmp_path):
    assert _one(tmp_path, _body(max_tokens=50, max_completion_tokens=7)).params == {
        "max_tokens": 7}
    assert _one(tmp_path, _body(max_tokens=50)).params == {"max_tokens": 50}
    row = _one(tmp_path, _body(max_tokens=5, max_completion_tokens=-1))
    assert 'field "body.max_completion_tokens" must be an integer >= 0, got -1' in row.error
    plain = _one(tmp_path, {"prompt": "x", "max_tokens": 9, "max_completion_tokens": 3})
    assert plain.params == {"max_tokens": 3}


def test_restated_defaults_are_accepted_and_ignored(tmp_path):
    row = _one(tmp_path, _body(response_format={"type": "text"}, n=1, stream=False,
                               logprobs=False, parallel_tool_calls=True, user="u-1",
                               metadata={"team": "x"}, store=False, presence_penalty=0.0,
                               frequency_penalty=0, top_logprobs=0, tool_choice="none",
                               service_tier="auto", stream_options=None))
    assert row.error is None
    # the structured-output and penalty fields restated at their defaults ask for nothing
    assert row.params == {"n": 1, "structured_outputs": None, "logprobs": None,
                          "presence_penalty": 0.0, "frequency_penalty": 0.0}


@pytest.mark.parametrize("field,value,why", [
    ("tools", [{"type": "function", "function": {"name": "f"}}], "tool calling"),
    ("tool_choice", "auto", "tool calling"), ("best_of", 2, "ranking best_of"),
    ("echo", True, "echoing the prompt"), ("use_beam_search", True, "beam search"),
    ("n", 0, "must be an integer from 1"), ("stream", True, "does not stream"),
])
def test_features_that_change_the_output_are_errors_naming_them(tmp_path, field, value, why):
    row = _one(tmp_path, _body(**{field: value}))
    assert f'line 1: field "body.{field}"' in row.error
    assert why in row.error  # the reason, not only "not supported"


@pytest.mark.parametrize("field,value,params", [
    ("prompt_logprobs", 2, {"prompt_logprobs": 2}),
    ("presence_penalty", 0.5, {"presence_penalty": 0.5}),
    ("frequency_penalty", -2, {"frequency_penalty": -2.0}),
    ("repetition_penalty", 1.3, {"repetition_penalty": 1.3}),
    ("logit_bias", {"5": 1, "7": -100.0}, {"logit_bias": {5: 1, 7: -100.0}}),
])
def test_penalty_fields_are_read(tmp_path, field, value, params):
    row = _one(tmp_path, _body(**{field: value}))
    assert row.error is None and row.params == params


def test_plain_rows_use_the_same_table(tmp_path):
    ok = _one(tmp_path, {"prompt": "x", "logprobs": False, "response_format": {"type": "text"},
                         "user": "u", "presence_penalty": 0.5})
    assert ok.error is None and ok.params["presence_penalty"] == 0.5
    bad = _one(tmp_path, {"prompt": "x", "use_beam_search": True})
    assert bad.error.endswith('field "use_beam_search" is not supported by mlxpa: beam search '
                              'is not implemented')


def test_n_is_bounded(tmp_path):
    """n = 10**9 would queue a billion requests: an error naming the bound (1024)."""
    assert _one(tmp_path, {"prompt": "x", "n": 1024}).params == {"n": 1024}
    row = _one(tmp_path, {"prompt": "x", "n": 10**9})
    assert row.error.endswith('field "n" must be an integer from 1 to 1024, got 1000000000')

