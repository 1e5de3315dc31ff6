"""What ``mlxpa serve`` answers, through the real ``openai`` client, against ``LLM`` on the same
model folder and engine options (the oracle: the same seeds give the same samples however
requests are batched): completions and chat, whole and streamed (a stream's pieces join to
the whole answer), ``n`` with seeds, stop strings, log-probabilities, penalties and
``logit_bias``, a JSON schema, a choice with its label probabilities, token-id prompts, and
concurrent clients."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from mlxpa import SamplingParams, StructuredOutputsParams
from tests.entrypoints.openai.conftest import NAME

PROMPTS = ["the cat sat on the mat", "hello world, hello", "0123456789", "a"]
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]


def _one(oracle, prompt, **params):
    return oracle.generate([prompt], SamplingParams(**params), use_tqdm=False)[0]


def test_completions_greedy_equal_llm_generate(client, oracle):
    want = oracle.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24),
                           use_tqdm=False)
    for prompt, w in zip(PROMPTS, want):
        r = client.completions.create(model=NAME, prompt=prompt, max_tokens=24, temperature=0)
        assert r.model == NAME and r.object == "text_completion"
        assert r.choices[0].text == w.outputs[0].text
        assert r.choices[0].finish_reason == w.outputs[0].finish_reason
        assert r.usage.prompt_tokens == len(w.prompt_token_ids)
        assert r.usage.completion_tokens == len(w.outputs[0].token_ids)


def test_chat_greedy_equals_llm_chat_with_the_models_template(client, oracle):
    want = oracle.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)[0]
    r = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=20,
                                       temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want.outputs[0].text
    assert r.usage.prompt_tokens == len(want.prompt_token_ids)


def test_token_id_prompt_equals_its_text(client, oracle):
    ids = oracle.get_tokenizer().encode("hello world, hello")
    by_ids = client.completions.create(model=NAME, prompt=ids, max_tokens=12, temperature=0)
    by_text = client.completions.create(model=NAME, prompt="hello world, hello", max_tokens=12,
                                        temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)


def test_n_samples_with_a_seed_equal_llm(client, oracle):
    want = _one(oracle, PROMPTS[1], n=3, seed=11, temperature=1.0, max_tokens=16)
    r = client.completions.create(model=NAME, prompt=PROMPTS[1], n=3, seed=11, temperature=1.0,
                                  max_tokens=16)
    got = sorted(r.choices, key=lambda c: c.index)
    assert [c.text for c in got] == [o.text for o in want.outputs]
    assert len({c.text for c in got}) > 1  # really sampled
    assert r.usage.completion_tokens == sum(len(o.token_ids) for o in want.outputs)


def test_stop_string_cuts_the_greedy_text(client, oracle):
    full = _one(oracle, PROMPTS[0], temperature=0, max_tokens=30).outputs[0].text
    stop = full[10:12]
    expected = full[:full.index(stop)]
    r = client.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=30, temperature=0,
                                  stop=[stop])
    assert r.choices[0].text == expected
    assert r.choices[0].finish_reason == "stop"


def test_chat_logprobs_equal_llm_with_token_bytes(client, oracle):
    want = oracle.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=8, logprobs=3),
                       use_tqdm=False)[0].outputs[0]
    r = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=8,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == len(want.token_ids)
    for entry, token_id, by_id in zip(content, want.token_ids, want.logprobs):
        assert entry.logprob == pytest.approx(by_id[token_id].logprob, abs=1e-5)
        assert entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob


def test_penalties_and_logit_bias_equal_llm(client, oracle):
    params = {"presence_penalty": 1.5, "frequency_penalty": 0.5, "repetition_penalty": 1.3}
    want = _one(oracle, PROMPTS[1], temperature=0, max_tokens=20, logit_bias={40: 3.0},
                **params).outputs[0].text
    plain = _one(oracle, PROMPTS[1], temperature=0, max_tokens=20).outputs[0].text
    r = client.completions.create(model=NAME, prompt=PROMPTS[1], max_tokens=20, temperature=0,
                                  logit_bias={"40": 3.0}, extra_body=params)
    assert r.choices[0].text == want != plain


def test_json_schema_answer_is_valid_and_equals_llm(client, oracle):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}},
              "required": ["ok"], "additionalProperties": False,
              "x-guidance": {"whitespace_flexible": False}}  # no runs of white space
    want = oracle.chat(MESSAGES, SamplingParams(
        temperature=0, max_tokens=40, structured_outputs=StructuredOutputsParams(json=schema)),
        use_tqdm=False)[0].outputs[0]
    r = client.chat.completions.create(
        model=NAME, messages=MESSAGES, max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
    text = r.choices[0].message.content
    assert text == want.text and r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), schema)


def test_choice_answers_a_label_with_its_probabilities(client, oracle):
    labels = ["yes", "no", "maybe"]
    want = oracle.chat(MESSAGES, SamplingParams(
        temperature=0, structured_outputs=StructuredOutputsParams(choice=labels)),
        use_tqdm=False)[0].outputs[0]
    r = client.chat.completions.create(model=NAME, messages=MESSAGES, temperature=0,
                                       extra_body={"structured_outputs": {"choice": labels}})
    choice = r.choices[0]
    assert choice.message.content == want.text and want.text in labels
    probs = choice.model_extra["choice_probs"]
    # another batch shape than LLM's: float32 logits differ in their last bits (1.4e-6 seen)
    assert probs == pytest.approx(want.choice_probs, rel=1e-4, abs=1e-6)
    assert sum(probs.values()) == pytest.approx(1.0)


def test_a_streamed_choice_has_its_label_and_probabilities_in_its_last_chunk(client):
    labels = ["yes", "no", "maybe"]
    args = {"model": NAME, "messages": MESSAGES, "temperature": 0,
            "extra_body": {"structured_outputs": {"choice": labels}}}
    whole = client.chat.completions.create(**args).choices[0]
    chunks = [c for c in client.chat.completions.create(**args, stream=True) if c.choices]
    last = chunks[-1].choices[0]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.message.content
    assert last.finish_reason == whole.finish_reason
    assert last.model_extra["choice_probs"] == whole.model_extra["choice_probs"]


def test_chat_stream_joins_to_the_whole_answer(client):
    args = {"model": NAME, "messages": MESSAGES, "n": 3, "seed": 5, "temperature": 1.0,
            "max_tokens": 40, "stop": ["ab", "e "], "logprobs": True, "top_logprobs": 1}
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(
        **args, stream=True, stream_options={"include_usage": True}))
    texts, reasons, tokens = ["", "", ""], [None] * 3, [[], [], []]
    for chunk in chunks[:-1]:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            reasons[c.index] = c.finish_reason or reasons[c.index]
            tokens[c.index] += [e.token for e in (c.logprobs.content if c.logprobs else [])]
    for c in whole.choices:
        assert texts[c.index] == c.message.content
        assert reasons[c.index] == c.finish_reason
        assert tokens[c.index] == [e.token for e in c.logprobs.content]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_completions_stream_joins_to_the_whole_answer(client):
    args = {"model": NAME, "prompt": PROMPTS[0], "max_tokens": 30, "temperature": 0,
            "logprobs": 2, "stop": ["t "]}
    whole = client.completions.create(**args).choices[0]
    text, offsets, tokens, reason = "", [], [], None
    for chunk in client.completions.create(**args, stream=True):
        for c in chunk.choices:
            text += c.text
            reason = c.finish_reason or reason
            if c.logprobs:
                offsets += c.logprobs.text_offset
                tokens += c.logprobs.tokens
    assert (text, reason) == (whole.text, whole.finish_reason)
    assert tokens == whole.logprobs.tokens
    assert offsets == whole.logprobs.text_offset


def test_concurrent_clients_get_their_own_greedy_answers(client, oracle):
    prompts = [f"{p} #{i}" for i in range(3) for p in PROMPTS[:3]]
    want = oracle.generate(prompts, SamplingParams(temperature=0, max_tokens=16),
                           use_tqdm=False)

    def ask(prompt: str) -> str:
        return client.completions.create(model=NAME, prompt=prompt, max_tokens=16,
                                         temperature=0).choices[0].text

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(ask, prompts))
    assert got == [w.outputs[0].text for w in want]


def test_the_prefix_cache_serves_a_shared_system_prompt_to_later_requests(client):
    system = {"role": "system", "content": "You answer questions about cats. " * 3}
    first, second = (client.chat.completions.create(
        model=NAME, messages=[system, {"role": "user", "content": q}], max_tokens=2,
        temperature=0) for q in ("why do cats purr?", "how old do cats get?"))
    assert first.usage.prompt_tokens_details.cached_tokens < 96
    # one token per character: BOS, "system: <content>\nuser: " are shared; every full
    # 16-token block of them comes from the cache
    shared = 1 + len("system: " + system["content"] + "\nuser: ")
    assert second.usage.prompt_tokens_details.cached_tokens == 16 * (shared // 16)


def test_models_route_names_the_served_model(client):
    models = client.models.list().data
    assert [m.id for m in models] == [NAME]
    assert models[0].model_extra["max_model_len"] == 192
