"""The default model (Gemma 3 270M) served, one chat request answered through the ``openai``
client: its prompt is the model's chat template rendered by the tokenizer itself (the
template ``mlxpa run`` uses), and the streamed answer joins to the whole one."""

from __future__ import annotations

import pytest

from tests.entrypoints.openai.conftest import NAME, running_server

MESSAGES = [{"role": "user", "content": "Name a primary colour. Answer in one word."}]


@pytest.mark.real_model
def test_the_default_model_answers_a_chat_request(default_model_dir):
    from mlx_lm.tokenizer_utils import load as load_tokenizer
    from openai import OpenAI

    engine = {"kv_cache_memory_bytes": 2**26, "max_model_len": 1024}  # 1,820 tokens
    with running_server(str(default_model_dir), engine=engine) as s:
        client = OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=300)
        args = {"model": NAME, "messages": MESSAGES, "max_tokens": 12, "temperature": 0}
        whole = client.chat.completions.create(**args)
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            **args, stream=True) if c.choices)
    answer = whole.choices[0].message.content
    assert answer.strip() and answer == streamed
    tokenizer = load_tokenizer(default_model_dir)
    rendered = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert whole.usage.prompt_tokens == len(rendered)
    assert whole.choices[0].finish_reason in ("stop", "length")
