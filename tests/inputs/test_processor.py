"""``InputProcessor``: a text, token-id or chat prompt with its ``SamplingParams`` to the
engine's request under the caller's string id, on the byte tokenizer of the tiny models.
Oracles: the Hugging Face tokenizer's own ``encode`` and ``apply_chat_template`` with the same
arguments, and each error's text written out by hand (it names the field, so a server can
answer it as a bad request)."""

from __future__ import annotations

import re

import pytest

from mlxpa.inputs import ChatPrompt, InputProcessor
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams, StructuredOutputsParams
from tests.tiny_models import byte_tokenizer

# Raises on an unknown role (as real templates do); shows a "style" variable and the
# generation prompt.
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] not in ['user', 'assistant', 'system'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if style %}[{{ style }}] {% endif %}{% if add_generation_prompt %}assistant:{% endif %}")
VOCAB = 256
CONV = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
OOV = "token id {} is outside the model's vocabulary (256 ids, 0..255)"


@pytest.fixture(scope="module")
def tok():
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    fast = byte_tokenizer()._tokenizer
    fast.chat_template = TEMPLATE
    return TokenizerWrapper(fast, eos_token_ids={1})


@pytest.fixture(scope="module")
def processor(tok):
    return InputProcessor(tok, VOCAB, max_model_len=64)


def test_a_text_prompt_is_the_tokenizers_encoding(processor, tok):
    params = SamplingParams(max_tokens=3, temperature=0.5)
    req = processor.process_inputs("req-1", "the cat sat", params)
    assert isinstance(req, EngineRequest)
    assert req == EngineRequest("req-1", tok._tokenizer.encode("the cat sat"), params)
    # control tokens in a text prompt are kept as written
    assert processor.prompt_token_ids("<bos>x<eos>") == [2, tok._tokenizer.encode("x")[0], 1]
    split = InputProcessor(tok, split_special_tokens=True)
    assert split.prompt_token_ids("a<eos>") == tok._tokenizer.encode(
        "a<eos>", split_special_tokens=True)


def test_token_ids_are_taken_as_given(processor):
    params = SamplingParams()
    assert processor.process_inputs("t", [5, 6, 255], params).prompt_token_ids == [5, 6, 255]
    req = processor.process_inputs("u", (7, 8), params)
    assert req.prompt_token_ids == [7, 8] and isinstance(req.prompt_token_ids, list)


def test_a_chat_prompt_is_the_templates_rendering(processor, tok):
    hf = tok._tokenizer

    def oracle(conv, **kwargs) -> list[int]:  # the tokenizer's own rendering, then encoding
        return hf.encode(hf.apply_chat_template(conv, tokenize=False, **kwargs))

    assert processor.prompt_token_ids(ChatPrompt(CONV)) == oracle(
        CONV, add_generation_prompt=True)
    bare = processor.prompt_token_ids(ChatPrompt(CONV, add_generation_prompt=False))
    assert bare == oracle(CONV, add_generation_prompt=False)
    styled = processor.prompt_token_ids(ChatPrompt(CONV, {"style": "terse"}))
    assert styled == oracle(CONV, add_generation_prompt=True, style="terse")
    assert hf.decode(styled).endswith("[terse] assistant:")
    # the template's variables win over add_generation_prompt, as in vLLM
    assert processor.prompt_token_ids(ChatPrompt(CONV, {"add_generation_prompt": False})) == bare
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                          {"type": "text", "text": "b"}]}]
    assert processor.prompt_token_ids(ChatPrompt(parts)) == oracle(
        [{"role": "user", "content": "a\nb"}], add_generation_prompt=True)


LONE = "(JSON's \\uD800-\\uDFFF escapes must come in pairs)"


@pytest.mark.parametrize(("prompt", "message"), [
    ("", 'field "prompt" must be a non-empty string, got ""'),
    ("  \n", 'field "prompt" must be a non-empty string, got "  \\n"'),
    ([], 'field "prompt_token_ids" must be a non-empty list of token ids (integers >= 0), '
         "got []"),
    ([3, -1], 'field "prompt_token_ids" must be a non-empty list of token ids (integers >= 0), '
              "got [3, -1]"),
    ([5, 999], 'field "prompt_token_ids": ' + OOV.format(999)),
    (ChatPrompt([]), 'field "messages" must be a non-empty list of {"role", "content"} '
                     "objects, got []"),
    (ChatPrompt(["hi"]), 'field "messages[0]" must be an object with "role" and "content", '
                         'got "hi"'),
    (ChatPrompt([{"role": "user", "content": 3}]),
     'field "messages[0].content" must be a string, got 3'),
    (ChatPrompt([CONV[0], {"content": "x"}]), 'field "messages[1].role" must be a string, '
                                              "got null"),
    (ChatPrompt([{"role": "user", "content": [{"type": "image_url"}]}]),
     'field "messages[0].content" must be a string or a list of {"type": "text", "text": '
     'string} parts, got [{"type": "image_url"}]'),
    (ChatPrompt(CONV, {"tokenize": True}),
     'field "chat_template_kwargs" must be an object of template variables (not '
     "chat_template, conversation, max_length, padding, return_assistant_tokens_mask, "
     'return_dict, return_tensors, tokenize, tokenizer_kwargs, truncation), got '
     '{"tokenize": true}'),
    (ChatPrompt([{"role": "tool", "content": "x"}]),
     'field "messages": the chat template rejected them: unknown role tool'),
    ("x" * 70, "prompt has 70 tokens; the limit is 63 (the model context (--max-model-len) "
               "holds 64 tokens)"),
    ("ab\ud800", 'field "prompt" is not Unicode text: a lone surrogate \\ud800 at character 3 '
                 + LONE),
    (ChatPrompt([{"role": "user", "content": "hi", "name": "\udc00"}]),
     'field "messages[0].name" is not Unicode text: a lone surrogate \\udc00 at character 1 '
     + LONE),
], ids=["empty", "blank", "no-ids", "negative-id", "oov-id", "no-messages", "not-a-message",
        "content", "role", "content-part", "template-kwargs", "template-rejects",
        "over-context", "lone-surrogate", "lone-surrogate-in-messages"])
def test_a_bad_prompt_is_a_value_error_naming_its_field(processor, prompt, message):
    with pytest.raises(ValueError) as e:
        processor.process_inputs("r", prompt, SamplingParams())
    assert str(e.value) == message


def test_a_model_without_a_chat_template():
    plain = InputProcessor(byte_tokenizer())
    with pytest.raises(ValueError, match=re.escape(
            'field "messages": this model has no chat template; give a text "prompt" (or a '
            'template: --chat-template)')):
        plain.process_inputs("r", ChatPrompt(CONV), SamplingParams())


@pytest.mark.parametrize(("params", "message"), [
    (SamplingParams(stop_token_ids=[3, 300]), 'field "stop_token_ids": ' + OOV.format(300)),
    (SamplingParams(logit_bias={256: 1.0}), 'field "logit_bias": ' + OOV.format(256)),
    (SamplingParams(structured_outputs=StructuredOutputsParams(regex="[a-")),
     "structured_outputs: invalid regex"),
], ids=["stop_token_ids", "logit_bias", "structured_outputs"])
def test_bad_sampling_params_name_the_field(processor, params, message):
    with pytest.raises(ValueError) as e:
        processor.process_inputs("r", "hi", params)
    assert str(e.value).startswith(message)
    processor.prompt_request("r", "hi", params)  # the caller checked them (a file row)


def test_wrong_types_are_type_errors(processor):
    with pytest.raises(TypeError, match="^request_id must be a string, got int$"):
        processor.process_inputs(7, "hi", SamplingParams())
    with pytest.raises(TypeError, match="^prompt must be a string, a list of token ids or a "
                       "ChatPrompt, got float$"):
        processor.process_inputs("r", 1.5, SamplingParams())
    with pytest.raises(TypeError, match="^sampling_params must be a SamplingParams, got dict$"):
        processor.process_inputs("r", "hi", {"max_tokens": 3})
    with pytest.raises(TypeError, match="^add_generation_prompt must be True or False"):
        processor.process_inputs("r", ChatPrompt(CONV, None, "yes"), SamplingParams())
