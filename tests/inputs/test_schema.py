"""The request schema (:func:`mlxpa.inputs.schema.parse_request`) read the same way from every
envelope, and the one merge (:meth:`InputProcessor.process_inputs`): a row and an HTTP body
with the same fields give the same parameters; an HTTP body's own fields (``stream``, a
token-id ``prompt``) are checked first; vLLM's ``add_special_tokens`` is honoured. Oracle:
``SamplingParams`` built by hand, the tokenizer's own encoding."""

from __future__ import annotations

import pytest
from tokenizers import processors

from mlxpa.inputs import ChatPrompt, InputProcessor
from mlxpa.inputs.schema import ROW, RequestSpec, parse_request
from mlxpa.sampling_params import CheckedFields, RequestOutputKind, SamplingParams
from tests.tiny_models import byte_tokenizer

HTTP_CHAT = RequestSpec(body=True, api="chat", served=True)
HTTP_COMPLETIONS = RequestSpec(body=True, api="completions", served=True)
DEFAULTS = SamplingParams(temperature=1.0, max_tokens=50)


@pytest.fixture(scope="module")
def bos_tokenizer():
    """The byte tokenizer, adding BOS (id 2) as most tokenizers do."""
    tok = byte_tokenizer()
    tok._tokenizer._tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", 2)])
    return tok


def test_a_row_and_a_body_give_the_same_parameters():
    fields = {"temperature": 0.5, "stop": "x", "max_completion_tokens": 7.0, "top_k": -1,
              "logit_bias": {"5": 1}, "seed": 3}
    row = parse_request({"prompt": "p", **fields})
    body = parse_request({"prompt": "p", **fields}, HTTP_COMPLETIONS)
    assert row.problems == body.problems == ()
    assert isinstance(row.params, CheckedFields) and row.params == body.params
    want = SamplingParams(temperature=0.5, stop=("x",), max_tokens=7, top_k=0,
                          logit_bias={5: 1.0}, seed=3)
    processor = InputProcessor(byte_tokenizer(), 256, 64)
    for parsed in (row, body):
        assert processor.sampling_params(parsed, SamplingParams()) == want
    assert row.id == 0 and body.id is None and body.api == "completions"


def test_a_streamed_body_asks_for_deltas_and_its_own_fields_come_first():
    parsed = parse_request({"messages": [{"role": "user", "content": "hi"}], "stream": True,
                            "stream_options": {"include_usage": True}}, HTTP_CHAT)
    assert parsed.stream and parsed.include_usage and not parsed.problems
    processor = InputProcessor(byte_tokenizer(), 256, 64)
    assert processor.sampling_params(parsed, DEFAULTS).output_kind is RequestOutputKind.DELTA
    first = parse_request({"prompt": 5, "temperature": -1, "stream": "yes"}, HTTP_COMPLETIONS)
    assert first.problems == ('field "stream" must be true or false, got "yes"',)


def test_a_completions_prompt_of_token_ids():
    parsed = parse_request({"prompt": [[5, 6, 7]], "max_tokens": 2}, HTTP_COMPLETIONS)
    assert parsed.prompt_token_ids == [5, 6, 7] and parsed.prompt is None
    request = InputProcessor(byte_tokenizer(), 256, 64).process_inputs("r", parsed, DEFAULTS)
    assert request.prompt_token_ids == [5, 6, 7]
    assert request.sampling_params == SamplingParams(temperature=1.0, max_tokens=2)


def test_every_problem_is_listed_naming_the_field_as_the_source_spells_it():
    row = parse_request({"prompt": "", "temperature": -1, "tools": [1], "id": 1.5})
    assert row.problems == (
        'field "tools" is not supported by mlxpa: tool calling is not implemented (no '
        'tool-call parsing)', 'field "id" must be a string or an integer, got 1.5',
        'field "prompt" must be a non-empty string, got ""',
        'field "temperature" must be a finite number >= 0, got -1')
    batch = parse_request({"messages": []}, RequestSpec(body=True, api="completions",
                                                        prefix="body.", route="the url"))
    assert batch.problems == ('field "body.messages" must be a non-empty list of {"role", '
                              '"content"} objects, got []',)


def test_the_merge_is_the_one_place_rules_between_fields_meet():
    parsed = parse_request({"prompt": "p", "min_tokens": 20}, ROW)
    processor = InputProcessor(byte_tokenizer(), 256, 64)
    with pytest.raises(ValueError, match=r"min_tokens must be <= max_tokens \(10\)"):
        processor.process_inputs("r", parsed, SamplingParams(max_tokens=10))
    assert processor.process_inputs("r", parsed, SamplingParams(max_tokens=30)) \
        .sampling_params.min_tokens == 20


def test_add_special_tokens_is_honoured(bos_tokenizer):
    processor = InputProcessor(bos_tokenizer, 256, 64)
    text = bos_tokenizer._tokenizer.encode("hi", add_special_tokens=False)
    assert text and text[0] != 2
    for value, want in ((None, [2, *text]), (True, [2, *text]), (False, text)):
        fields = {"prompt": "hi"} if value is None else {"prompt": "hi",
                                                         "add_special_tokens": value}
        parsed = parse_request(fields, ROW)
        assert processor.process_inputs("r", parsed, DEFAULTS).prompt_token_ids == want
    chat = InputProcessor(bos_tokenizer, 256, 64,
                          chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    messages = ChatPrompt([{"role": "user", "content": "hi"}])
    assert chat.prompt_token_ids(messages) == [2, *text]
    assert chat.prompt_token_ids(messages, add_special_tokens=False) == text
    assert parse_request({"prompt": "x", "add_special_tokens": 1}).problems == (
        'field "add_special_tokens" must be true or false, got 1',)


def test_a_request_with_problems_is_refused_by_the_processor():
    parsed = parse_request({"prompt": "", "temperature": -1})
    with pytest.raises(ValueError, match=r'field "prompt" must be .*; field "temperature"'):
        InputProcessor(byte_tokenizer(), 256, 64).process_inputs("r", parsed, DEFAULTS)
