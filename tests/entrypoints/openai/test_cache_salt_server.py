"""``cache_salt`` over HTTP (vLLM's request field) on ``/v1/completions``,
``/v1/chat/completions`` and ``/v1/annotations``: a request hits only what requests of its own
salt cached (``usage.prompt_tokens_details.cached_tokens`` and the server's
``vllm:prefix_cache_hits_total``), with the same text; a bad salt is OpenAI's error object,
400, ``param: "cache_salt"``, before any model work, and the server keeps serving."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.entrypoints.openai.conftest import NAME

DOC = "Minutes of the board: the quarterly numbers were reviewed and approved. " * 2
CHAT = [{"role": "user", "content": DOC}]
QUESTIONS = [{"name": "ok", "type": "choice", "labels": ["yes", "no"], "template": "\nOK? "}]


def _completion(client, salt: str | None):
    extra = {} if salt is None else {"cache_salt": salt}
    r = client.completions.create(model=NAME, prompt=DOC, max_tokens=3, temperature=0,
                                  extra_body=extra)
    return r.choices[0].text, r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens


def test_completions_hit_only_their_own_salt(client, server):
    hits = server.metrics()["vllm:prefix_cache_hits_total"]
    runs = [_completion(client, s) for s in ("alice", "bob", "alice", None, None, "bob")]
    texts, cached, prompt = zip(*runs)
    hit = (prompt[0] - 1) // 16 * 16
    assert cached == (0, 0, hit, 0, hit, hit) and hit >= 128
    assert len(set(texts)) == 1  # a hit changes nothing in the answer
    assert server.metrics()["vllm:prefix_cache_hits_total"] - hits == 3 * hit


def test_chat_hits_only_its_own_salt(client):
    def chat(salt):
        r = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=2,
                                           temperature=0, extra_body={"cache_salt": salt})
        return r.choices[0].message.content, r.usage.prompt_tokens_details.cached_tokens

    (a, first), (b, other), (c, again) = chat("t1"), chat("t2"), chat("t1")
    assert (first, other) == (0, 0) and again > 0 and a == b == c


def test_annotations_take_a_salt(server):
    body = {"prompt": DOC, "questions": QUESTIONS}
    got = []
    for salt in ("q1", "q2", "q1"):
        r = httpx.post(f"{server.url}/v1/annotations", json={**body, "cache_salt": salt},
                       timeout=60)
        assert r.status_code == 200, r.text
        got.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert got[:2] == [0, 0] and got[2] > 0


BAD = ['""', "7", "true", '["a"]', '{"k": "v"}', "1.5", json.dumps("x" * 257),
       json.dumps("s" * 100_000), '"a\\ud800"']


@pytest.mark.parametrize("route", ["completions", "chat/completions", "annotations"])
@pytest.mark.parametrize("salt", BAD)
def test_a_bad_salt_is_400_naming_cache_salt(server, route, salt):
    body = {"prompt": "x"} if route != "chat/completions" else {"messages": CHAT}
    if route == "annotations":
        body["questions"] = QUESTIONS
    raw = json.dumps(body)[:-1] + f', "cache_salt": {salt}}}'
    before = server.metrics()["vllm:prompt_tokens_total"]
    r = httpx.post(f"{server.url}/v1/{route}", content=raw, timeout=30,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"], error["type"], error["code"]) == (
        "cache_salt", "invalid_request_error", "invalid_request")
    assert len(error["message"]) < 300 and "s" * 100 not in error["message"]
    assert server.metrics()["vllm:prompt_tokens_total"] == before  # no model work
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_the_openai_client_sees_the_error_object(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=NAME, prompt="x", max_tokens=1,
                                  extra_body={"cache_salt": ""})
    assert e.value.status_code == 400 and e.value.param == "cache_salt"
    assert e.value.message.endswith('field "cache_salt" must be a non-empty string of at most '
                                    '256 characters, got ""')
    assert _completion(client, "after")[1] == 0  # and the server still answers
