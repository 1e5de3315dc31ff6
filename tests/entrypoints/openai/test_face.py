"""The server as clients send to it: OpenAI's ``developer`` role read as ``system``; vLLM's
``skip_special_tokens`` and ``spaces_between_special_tokens`` refused by name unless they say
what mlxpa does, ``add_special_tokens`` read (honoured: ``tests/inputs/test_schema.py``); a
body that is not JSON gets OpenAI's error object; ``--chat-template`` gives a folder without
one a template; typed questions over one document (``POST /v1/annotations``) get the answers
``LLM.annotate`` gives."""

from __future__ import annotations

import httpx
import pytest

from mlxpa import SamplingParams
from tests.entrypoints.openai.conftest import ENGINE, running_server
from tests.tiny_models import save_tiny_model

QUESTIONS = [{"name": "tea", "type": "yes_no", "question": "Is it about tea?"},
             {"name": "mood", "type": "choice", "labels": ["calm", "angry", "sad"],
              "question": "Mood?"}]


def _post(server, route: str, **kw) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/{route}", timeout=60, **kw)


def test_developer_is_system(server, oracle):
    developer = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}]
    system = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    (want,) = oracle.chat(system, SamplingParams(max_tokens=6), use_tqdm=False)
    r = _post(server, "chat/completions", json={"messages": developer, "max_tokens": 6,
                                                "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"] == want.outputs[0].text
    assert body["usage"]["prompt_tokens"] == len(want.prompt_token_ids)


@pytest.mark.parametrize("field", ["skip_special_tokens", "spaces_between_special_tokens"])
def test_vllm_detokenizer_fields_are_refused_by_name_unless_false(server, field):
    ok = _post(server, "completions", json={"prompt": "x", "max_tokens": 2, field: False})
    assert ok.status_code == 200, ok.text
    r = _post(server, "completions", json={"prompt": "x", "max_tokens": 2, field: True})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == field
    assert "special tokens" in error["message"] and "give false" in error["message"]


def test_add_special_tokens_is_read(server):
    ok = _post(server, "completions", json={"prompt": "hello", "max_tokens": 2,
                                            "add_special_tokens": False})
    assert ok.status_code == 200, ok.text
    bad = _post(server, "completions", json={"prompt": "x", "add_special_tokens": "no"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "add_special_tokens"


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_json_gets_the_error_object(server, content_type):
    r = _post(server, "chat/completions", content=b"hello there",
              headers={"Content-Type": content_type})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert "not valid JSON" in r.json()["error"]["message"]


def test_the_chat_template_option_serves_chat_on_a_folder_without_one(tmp_path, oracle):
    from mlxpa import LLM

    template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}>"
    folder = save_tiny_model(tmp_path / "plain")
    chat = [{"role": "user", "content": "hi"}]
    (want,) = LLM(folder, **ENGINE).chat(chat, SamplingParams(max_tokens=4), use_tqdm=False,
                                         chat_template=template)
    with running_server(folder, chat_template=template) as s:
        r = _post(s, "chat/completions", json={"messages": chat, "max_tokens": 4,
                                               "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == want.outputs[0].text
    with running_server(folder) as s:
        r = _post(s, "chat/completions", json={"messages": chat})
    assert r.status_code == 400 and "--chat-template" in r.json()["error"]["message"]


def test_annotations_answer_as_llm_annotate(server, oracle):
    doc = "A quiet afternoon with a pot of green tea."
    (want,) = oracle.annotate(doc, QUESTIONS, use_tqdm=False)
    r = _post(server, "annotations", json={"prompt": doc, "questions": QUESTIONS,
                                           "model": "tiny"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "annotation" and body["id"].startswith("annot-")
    assert list(body["answers"]) == ["tea", "mood"]
    for name, answer in body["answers"].items():
        got = want.outputs[name]
        assert answer["label"] == got.label and answer["calibrated"] is False
        assert answer["probs"] == pytest.approx(got.probs, rel=1e-4)
    assert body["usage"]["completion_tokens"] == 0
    chat = _post(server, "annotations", json={
        "messages": [{"role": "user", "content": doc}], "questions": QUESTIONS})
    assert chat.status_code == 200 and list(chat.json()["answers"]) == ["tea", "mood"]


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"prompt": "x"}, "questions", 'missing field "questions"'),
    ({"prompt": "x", "questions": [{"name": "q", "type": "multi"}]}, "questions[0].type",
     "must be"),
    ({"prompt": "x", "questions": QUESTIONS, "temprature": 1}, "temprature", "unknown"),
    ({"questions": QUESTIONS}, "prompt", "missing field"),
])
def test_a_bad_annotation_body_is_400_naming_the_field(server, body, param, words):
    r = _post(server, "annotations", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"]
