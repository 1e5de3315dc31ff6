"""``mlxpa bench serve``'s requests: the shared-prefix and random workloads as chat and
completions requests (prompt lengths against the tokenizer's own chat template), and a file
of ``mlxpa run`` rows and OpenAI Batch lines."""

from __future__ import annotations

import json

import pytest

from mlxpa.bench.serve_workloads import file_requests, synthetic_requests
from mlxpa.bench.workloads import shared_prefix_workload
from mlxpa.data import InputError
from mlxpa.loader.models import load_tokenizer_of
from tests.tiny_models import STRICT_TEMPLATE, save_tokenizer_only


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = save_tokenizer_only(tmp_path_factory.mktemp("m") / "t", chat_template=STRICT_TEMPLATE)
    return load_tokenizer_of(folder)


def test_shared_prefix_chat_requests_share_their_system_message(tokenizer):
    wl = synthetic_requests("shared-prefix", tokenizer, num_groups=2, prompts_per_group=3,
                            system_prompt_len=30, question_len=6, output_len=7, seed=4)
    ids = shared_prefix_workload(tokenizer, 2, 3, 30, 6, 7, seed=4).prompts
    assert len(wl.requests) == 6 and wl.params["endpoint"] == "chat"
    for i, r in enumerate(wl.requests):
        system, user = r.row["messages"]
        assert system == {"role": "system", "content": tokenizer.decode(ids[i][1:30])}  # no BOS
        assert user == {"role": "user", "content": tokenizer.decode(ids[i][30:])}
        assert r.row["max_tokens"] == 7 and r.row["temperature"] == 0.0 and r.endpoint == "chat"
        assert r.prompt_len == len(tokenizer.apply_chat_template(r.row["messages"],
                                                                 add_generation_prompt=True))
    m = [r.row["messages"] for r in wl.requests]
    assert m[0][0] == m[2][0] == m[4][0] != m[1][0] and m[0][1] != m[2][1]
    assert wl.num_output_tokens == 42


def test_completions_and_random_requests(tokenizer):
    wl = synthetic_requests("shared-prefix", tokenizer, "completions", num_groups=1,
                            prompts_per_group=2, system_prompt_len=20, question_len=5)
    for r in wl.requests:
        assert set(r.row) == {"prompt", "max_tokens", "temperature"}
        assert r.endpoint == "completions"
        assert r.prompt_len == len(tokenizer.encode(r.row["prompt"]))  # the BOS added
    rnd = synthetic_requests("random", tokenizer, num_prompts=4, input_len=10, range_ratio=0.5)
    assert all(len(r.row["messages"]) == 1 and r.row["messages"][0]["role"] == "user"
               for r in rnd.requests)
    with pytest.raises(ValueError, match="endpoint"):
        synthetic_requests("random", tokenizer, "embeddings")


def test_file_rows_and_openai_batch_lines(tokenizer, tmp_path):
    rows = [
        {"id": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
         "temperature": 0.7, "stop": "x"},
        {"prompt": "once upon"},
        {"custom_id": "b", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": "yo"}], "max_tokens": 2}},
        {"prompt": "bad", "temperature": -1},
        {"prompt": "nothing", "max_tokens": 0},
        {"messages": [{"role": "user", "content": "json"}],
         "response_format": {"type": "json_object"}},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    wl = file_requests(tokenizer, str(path), output_len=9)
    assert [r.endpoint for r in wl.requests] == ["chat", "completions", "chat", "chat"]
    first, second, third, fourth = (r.row for r in wl.requests)
    assert first == {"messages": rows[0]["messages"], "max_tokens": 3, "temperature": 0.7,
                     "stop": ["x"]}
    assert second == {"prompt": "once upon", "max_tokens": 9, "temperature": 0.0}
    assert third == {"messages": rows[2]["body"]["messages"], "max_tokens": 2,
                     "temperature": 0.0}
    assert "response_format" not in fourth
    p = wl.params
    assert p["invalid_rows"] == 1 and p["empty_rows"] == 1 and p["unsent_fields_rows"] == 1
    assert p["problems"][0].startswith(f"{path} line 4: ") and "temperature" in p["problems"][0]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x", "max_tokens": -2}) + "\n")
    with pytest.raises(InputError, match="max_tokens"):
        file_requests(tokenizer, str(bad))
