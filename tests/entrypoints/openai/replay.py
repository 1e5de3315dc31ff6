"""A recorded set of requests to ``mlxpa serve`` and the answers it gave (``replay.jsonl``,
recorded from the code before the request schema moved to ``mlxpa.inputs``), sent in order to a
fresh server on the tiny model of ``tests/entrypoints/conftest.py``.

``python -m tests.entrypoints.openai.replay`` records the file again (only when the answers
are meant to change); ``test_replay.py`` replays it. An answer is compared as the bytes the
server sent, with each response id and ``created`` time (random, the clock) put to fixed
values, and a float allowed to differ in its last digits (another BLAS); nothing else may
change."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

FIXTURE = Path(__file__).with_name("replay.jsonl")
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
USER = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}

# (route, body): a body given as a string is sent as it is (not JSON-encoded)
REQUESTS: list[tuple[str, object]] = [
    ("models", None),
    ("completions", {"prompt": "the cat sat on the mat", "max_tokens": 12, "temperature": 0}),
    ("completions", {"model": "tiny", "prompt": "hello world, hello", "max_tokens": 8,
                     "temperature": 0, "user": "u1"}),
    ("completions", {"prompt": [2, 104, 101, 108, 108, 111], "max_tokens": 6, "temperature": 0}),
    ("completions", {"prompt": ["one item"], "max_tokens": 5, "temperature": 0}),
    ("completions", {"prompt": [[2, 97, 98]], "max_tokens": 5, "temperature": 0}),
    ("completions", {"prompt": "hello world, hello", "n": 3, "seed": 11, "temperature": 1.0,
                     "max_tokens": 10}),
    ("completions", {"prompt": "0123456789", "max_tokens": 16, "temperature": 0.8, "seed": 3,
                     "top_p": 0.9, "top_k": 20, "min_p": 0.05}),
    ("completions", {"prompt": "the cat sat on the mat", "max_tokens": 20, "temperature": 0,
                     "stop": ["t "]}),
    ("completions", {"prompt": "the cat", "max_tokens": 20, "temperature": 0, "stop": "a",
                     "include_stop_str_in_output": True}),
    ("completions", {"prompt": "a", "max_tokens": 8, "temperature": 0, "logprobs": 2}),
    ("completions", {"prompt": "abc abc", "max_tokens": 4, "temperature": 0,
                     "prompt_logprobs": 2}),
    ("completions", {"prompt": "hello world, hello", "max_tokens": 12, "temperature": 0,
                     "presence_penalty": 1.5, "frequency_penalty": 0.5,
                     "repetition_penalty": 1.3, "logit_bias": {"40": 3.0}}),
    ("completions", {"prompt": "x", "max_tokens": 6, "min_tokens": 4, "ignore_eos": True,
                     "temperature": 0, "stop_token_ids": [3]}),
    ("completions", {"prompt": "Answer:", "temperature": 0,
                     "structured_outputs": {"choice": ["yes", "no", "maybe"]}}),
    ("completions", {"prompt": "Answer:", "temperature": 0, "guided_choice": ["a b", "c"],
                     "logprobs": 1}),
    ("completions", {"prompt": "Number:", "max_tokens": 10, "temperature": 0,
                     "structured_outputs": {"regex": "[0-9]{3}"}}),
    ("completions", {"prompt": "JSON:", "max_tokens": 40, "temperature": 0,
                     "response_format": {"type": "json_schema",
                                         "json_schema": {"name": "a", "schema": SCHEMA}}}),
    ("completions", {"prompt": "a long one", "temperature": 0}),
    ("completions", {"prompt": "the cat sat", "max_tokens": 12, "temperature": 0,
                     "logprobs": 1, "stream": True}),
    ("completions", {"prompt": "hello", "max_tokens": 8, "n": 2, "seed": 1, "temperature": 1.0,
                     "stream": True, "stream_options": {"include_usage": True}}),
    ("completions", {"prompt": "abc", "max_tokens": 3, "temperature": 0, "stream": True,
                     "prompt_logprobs": 1}),
    ("chat/completions", {"messages": CHAT, "max_tokens": 12, "temperature": 0}),
    ("chat/completions", {"messages": USER, "max_completion_tokens": 6, "temperature": 0}),
    ("chat/completions", {"messages": CHAT, "max_tokens": 6, "temperature": 0,
                          "logprobs": True, "top_logprobs": 2}),
    ("chat/completions", {"messages": USER, "max_tokens": 4, "temperature": 0,
                          "logprobs": True}),
    ("chat/completions", {"messages": USER, "max_tokens": 4, "temperature": 0,
                          "prompt_logprobs": 1}),
    ("chat/completions", {"messages": USER, "max_tokens": 5, "temperature": 0,
                          "chat_template_kwargs": {"style": "terse"}}),
    ("chat/completions", {"messages": CHAT, "max_tokens": 5, "temperature": 0,
                          "add_generation_prompt": False}),
    ("chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]}],
        "max_tokens": 5, "temperature": 0}),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi", "name": "ann"}],
                          "max_tokens": 5, "temperature": 0}),
    ("chat/completions", {"messages": CHAT, "temperature": 0,
                          "structured_outputs": {"choice": ["yes", "no", "maybe"]}}),
    ("chat/completions", {"messages": CHAT, "max_tokens": 30, "temperature": 0,
                          "response_format": {"type": "json_object"}}),
    ("chat/completions", {"messages": CHAT, "max_tokens": 30, "n": 2, "seed": 5,
                          "temperature": 1.0, "stop": ["ab", "e "], "logprobs": True,
                          "top_logprobs": 1, "stream": True,
                          "stream_options": {"include_usage": True}}),
    ("chat/completions", {"messages": CHAT, "temperature": 0, "stream": True,
                          "structured_outputs": {"choice": ["yes", "no"]}}),
    ("chat/completions", {"messages": USER, "max_tokens": 3, "temperature": 0, "stream": True,
                          "prompt_logprobs": 1}),
    # refused requests: the error object, its param and message
    ("completions", {"prompt": "x", "max_tokens": "a", "temperature": -1}),
    ("chat/completions", {"messages": USER, "temprature": 0}),
    ("chat/completions", {"messages": USER, "tools": [{"type": "function"}]}),
    ("completions", {"prompt": "x", "echo": True}),
    ("completions", {"prompt": "x" * 300}),
    ("chat/completions", {"messages": [{"role": "user", "content": "x" * 300}]}),
    ("chat/completions", {"messages": USER, "top_logprobs": 3}),
    ("chat/completions", {"messages": USER, "logprobs": 5}),
    ("completions", {"prompt": "x", "max_tokens": 400}),
    ("chat/completions", {"messages": USER, "max_completion_tokens": 10**12}),
    ("chat/completions", {"messages": [{"role": "robot", "content": "x"}]}),
    ("chat/completions", {"messages": []}),
    ("chat/completions", {"max_tokens": 3}),
    ("completions", {"prompt": "x", "response_format": {
        "type": "json_schema", "json_schema": {"schema": {"type": "objekt"}}}}),
    ("completions", {"prompt": "x", "response_format": {"type": "yaml"}}),
    ("completions", {"prompt": "x", "structured_outputs": {"regex": "[a-"}}),
    ("completions", {"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]}),
    ("completions", {"prompt": "x", "logit_bias": {"99999": 1}}),
    ("completions", {"prompt": "x", "stop_token_ids": [5, 70000]}),
    ("completions", {"prompt": "x", "n": 0, "top_p": 2}),
    ("completions", {"prompt": "x", "max_tokens": 2, "min_tokens": 5}),
    ("completions", {"prompt": "x", "max_tokens": 0, "prompt_logprobs": 1}),
    ("completions", {"prompt": ["a", "b"]}),
    ("completions", {"prompt": [1, -2]}),
    ("completions", {"prompt": [1, 70000], "max_tokens": 2}),
    ("completions", {"prompt": ""}),
    ("completions", {"prompt": "x", "stream": "yes"}),
    ("completions", {"prompt": "x", "stream_options": {"include_usage": True}}),
    ("completions", {"prompt": "x", "stream": True, "stream_options": {"usage": 1},
                     "temperature": 0, "max_tokens": 4}),
    ("completions", {"messages": USER}),
    ("chat/completions", {"prompt": "x"}),
    ("completions", {"prompt": "x", "best_of": 2, "use_beam_search": False, "best_of_n": 1}),
    ("completions", {"prompt": "x", "model": "gpt-4o"}),
    ("completions", {"prompt": "x", "seed": -1, "stop": 5, "logprobs": 50}),
    ("completions", '{"prompt": "x\\ud800"}'),
    ("chat/completions", '{"messages": [{"role": "user", "content": "x", "name": "\\udc00"}]}'),
    ("completions", '{"prompt": "x", "structured_outputs": {"choice": ["a", "\\udfff"]}}'),
    ("completions", "{not json"),
    ("completions", "[1, 2]"),
]

_ID = re.compile(r'"id": "(chatcmpl|cmpl)-[0-9a-f]{32}"')
_CREATED = re.compile(r'"created": \d+')


def normalized(text: str) -> str:
    """An answer with its response ids and ``created`` times put to fixed values."""
    return _CREATED.sub('"created": 0', _ID.sub(r'"id": "\1-0"', text))


def ask(url: str, route: str, body: object) -> dict:
    """One request to the server at ``url``: ``{"route", "body", "status", "answer"}``."""
    if route == "models":
        r = httpx.get(f"{url}/v1/models", timeout=120)
    elif isinstance(body, str):
        r = httpx.post(f"{url}/v1/{route}", content=body, timeout=120,
                       headers={"Content-Type": "application/json"})
    else:
        r = httpx.post(f"{url}/v1/{route}", json=body, timeout=120)
    return {"route": route, "body": body, "status": r.status_code,
            "answer": normalized(r.text)}


def record(url: str) -> list[dict]:
    """Every request of :data:`REQUESTS`, in order, with its answer."""
    return [ask(url, route, body) for route, body in REQUESTS]


def main() -> None:
    import tempfile

    from tests.entrypoints.conftest import TEMPLATE
    from tests.entrypoints.openai.conftest import running_server
    from tests.tiny_models import save_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = save_tiny_model(Path(tmp) / "tiny", chat_template=TEMPLATE)
        with running_server(folder) as server:
            lines = record(server.url)
    FIXTURE.write_text("".join(json.dumps(line, ensure_ascii=True) + "\n" for line in lines))
    print(f"wrote {len(lines)} requests to {FIXTURE}")


if __name__ == "__main__":
    main()
