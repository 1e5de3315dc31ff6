"""Every bad argument of ``LLM`` names the argument (and the prompt's index) and runs nothing:
the constructor's keywords (an unknown one with the closest valid name, vLLM's options mlxpa
does not have, values out of range), ``generate``'s prompts and sampling parameters,
``chat``'s conversations and options."""

from __future__ import annotations

import re

import pytest

from mlxpa import LLM, SamplingParams, StructuredOutputsParams
from tests.entrypoints.conftest import KV_BYTES


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"max_num_seq": 8}, TypeError,
     "LLM() got an unexpected keyword argument 'max_num_seq' (did you mean 'max_num_seqs'?)"),
    ({"enable_prefix_cache": False}, TypeError, "(did you mean 'enable_prefix_caching'?)"),
    ({"colour": "red"}, TypeError, "LLM() got an unexpected keyword argument 'colour'"),
    ({"gpu_memory_utilization": 0.9}, TypeError,
     "LLM() does not take vLLM's 'gpu_memory_utilization': mlxpa sizes the KV pool in bytes: "
     "kv_cache_memory_bytes"),
    ({"max_num_seqs": 0}, ValueError, "max_num_seqs must be an integer >= 1, got 0"),
    ({"kv_cache_memory_bytes": -5}, ValueError,
     "kv_cache_memory_bytes must be a number of bytes > 0, got -5"),
    ({"block_size": 12}, ValueError, "block_size must be a power of two from 1 to 256, got 12"),
    ({"dtype": "float64"}, ValueError, "dtype must be one of auto, float32, bfloat16, float16"),
    ({"enable_prefix_caching": "no"}, ValueError, "enable_prefix_caching must be true or false"),
    ({"seed": -1}, ValueError, "seed must be an integer >= 0, got -1"),
    # a bool is not a count, a string or float not a length (they were taken as 1, or
    # failed deep inside with a bare TypeError)
    ({"max_num_seqs": True}, ValueError, "max_num_seqs must be an integer >= 1, got true"),
    ({"block_size": True}, ValueError, "block_size must be a power of two from 1 to 256"),
    ({"max_num_batched_tokens": True}, ValueError,
     "max_num_batched_tokens must be an integer >= 1, got true"),
    ({"max_model_len": "8"}, ValueError,
     "max_model_len must be an integer >= 2 (a prompt token and an output token) or None, "
     'got "8"'),
    ({"max_model_len": 64.5}, ValueError, "max_model_len must be an integer >= 2"),
])
def test_constructor_keywords_fail_before_the_model_loads(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        LLM("/no/such/model", **kwargs)  # the model would fail to load: it is never reached
    with pytest.raises(TypeError, match="model must be a path, a Hugging Face repo id or None"):
        LLM(7)


def _raises(error, message, call, *args, **kwargs):
    with pytest.raises(error) as e:
        call(*args, **kwargs)
    assert str(e.value) == message


def test_bad_prompts_name_the_argument_and_the_index(llm):
    g = llm.generate
    _raises(TypeError, "prompts must be a string, a list of token ids, a dict (a row of mlxpa "
            "run) or a list of them, got int", g, 5)
    _raises(TypeError, "prompts[1]: expected a string, a list of token ids or a dict (a row of "
            "mlxpa run), got float", g, ["a", 1.5])
    _raises(ValueError, 'prompts[1]: field "temperature" must be a finite number >= 0, got -1',
            g, ["a", {"prompt": "b", "temperature": -1}])
    _raises(ValueError, 'prompts[0]: missing field "prompt" (or "messages") (is "promt" a '
            'typo?)', g, [{"promt": "x"}])
    _raises(ValueError, 'prompts[0]: field "prompt" must be a non-empty string, got ""', g, "")
    _raises(ValueError, 'prompts[2]: field "prompt_token_ids": token id 999 is outside the '
            "model's vocabulary (256 ids, 0..255)", g, ["a", [3, 4], [5, 999]])
    _raises(ValueError, 'prompts[0]: field "stop_token_ids": token id 300 is outside the '
            "model's vocabulary (256 ids, 0..255)", g, {"prompt": "a", "stop_token_ids": 300})
    _raises(ValueError, ('prompts[0]: field "best_of" is not supported by mlxpa: ranking best_of '
             'samples by log-probability is not implemented; use n and logprobs'), g,
            {"prompt": "a", "best_of": 3})
    _raises(ValueError, "prompts[1]: min_tokens must be <= max_tokens (2), as in vLLM, got 5",
            g, ["a", {"prompt": "b", "max_tokens": 2}], SamplingParams(min_tokens=5))
    assert not llm.llm_engine.has_unfinished_requests()  # nothing ran


def test_a_prompt_over_the_context_is_refused_before_anything_runs(folder):
    short = LLM(folder, max_model_len=8, kv_cache_memory_bytes=KV_BYTES)
    _raises(ValueError, "prompts[1]: prompt has 9 tokens; the limit is 7 (the model context "
            "(--max-model-len) holds 8 tokens)", short.generate, ["x", "x" * 9])
    assert short.llm_engine.counters.requests == 0


def test_bad_sampling_params_name_the_argument_and_the_index(llm):
    g = llm.generate
    _raises(ValueError, "sampling_params: 1 given for 2 prompts (give one, or one per prompt)",
            g, ["a", "b"], [SamplingParams()])
    _raises(TypeError, "sampling_params[1] must be a SamplingParams, got dict", g, ["a", "b"],
            [SamplingParams(), {"max_tokens": 3}])
    _raises(TypeError, "sampling_params must be a SamplingParams, a list of them (one per "
            "prompt) or None, got dict", g, "a", {"max_tokens": 3})
    bad_regex = SamplingParams(structured_outputs=StructuredOutputsParams(regex="[a-"))
    with pytest.raises(ValueError, match=r"^sampling_params\[0\]: structured_outputs: invalid "
                       r"regex"):
        g(["a"], [bad_regex])
    with pytest.raises(ValueError, match="^logprobs must be an integer from 0 to 20, got 21$"):
        SamplingParams(logprobs=21)
    with pytest.raises(ValueError, match="structured_outputs must give one of json, regex, "
                       "choice, grammar, json_object, got none"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="got regex, choice"):
        StructuredOutputsParams(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="structured_outputs.choice must be a non-empty list"):
        StructuredOutputsParams(choice="yes")
    with pytest.raises(ValueError, match=r"strings of Unicode text \(a label holds a lone "
                       r"surrogate\)"):  # no tokenizer can encode it
        StructuredOutputsParams(choice=["a", "b\ud800"])


def test_a_lone_surrogate_is_refused_naming_the_field(llm):
    lone = "(JSON's \\uD800-\\uDFFF escapes must come in pairs)"
    _raises(ValueError, 'prompts[1]: field "prompt" is not Unicode text: a lone surrogate '
            f"\\udc00 at character 2 {lone}", llm.generate, ["a", "b\udc00"])
    _raises(ValueError, 'prompts[0]: field "stop" is not Unicode text: a lone surrogate '
            f"\\ud800 at character 1 {lone}", llm.generate, {"prompt": "a", "stop": "\ud800"})
    _raises(ValueError, 'messages[0]: field "messages[0].content" is not Unicode text: a lone '
            f"surrogate \\ud800 at character 1 {lone}", llm.chat,
            [{"role": "user", "content": "\ud800"}])
    assert not llm.llm_engine.has_unfinished_requests()  # nothing ran


def test_bad_chat_arguments(llm):
    c = llm.chat
    conv = [{"role": "user", "content": "hi"}]
    _raises(TypeError, 'messages must be a conversation (a non-empty list of {"role", '
            '"content"} dicts) or a list of conversations', c, "hi")
    _raises(TypeError, "chat_template_kwargs must be a dict of template variables or None, got "
            "list", c, conv, chat_template_kwargs=["x"])
    _raises(TypeError, "add_generation_prompt must be True or False, got str", c, conv,
            add_generation_prompt="yes")
    with pytest.raises(ValueError, match=r'^messages\[1\]: field "messages": the chat template '
                       r"rejected them: unknown role tool"):
        c([conv, [{"role": "tool", "content": "x"}]])
    with pytest.raises(ValueError, match=r'^messages\[0\]: field "messages\[0\].content" must '
                       r"be a string"):
        c([{"role": "user", "content": 3}])


def test_token_ids_of_sampling_params_outside_the_vocabulary_raise(llm):
    """A ``SamplingParams``' own ``logit_bias`` and ``stop_token_ids`` are checked against the
    vocabulary at the call, as a row's are (they became an ``error`` output instead)."""
    oov = "token id 256 is outside the model's vocabulary (256 ids, 0..255)"
    _raises(ValueError, f'sampling_params: field "logit_bias": {oov}', llm.generate, "a",
            SamplingParams(logit_bias={256: 1.0}))
    _raises(ValueError, f'sampling_params[1]: field "stop_token_ids": {oov}', llm.generate,
            ["a", "b"], [SamplingParams(), SamplingParams(stop_token_ids=[3, 256])])
    _raises(ValueError, f'sampling_params: field "stop_token_ids": {oov}', llm.chat,
            [{"role": "user", "content": "hi"}], SamplingParams(stop_token_ids=256))
    _raises(ValueError, f'sampling_params: field "logit_bias": {oov}', llm.generate_iter,
            iter(["a"]), SamplingParams(logit_bias={256: 1.0}))
    assert not llm.llm_engine.has_unfinished_requests()  # nothing ran
