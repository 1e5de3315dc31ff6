"""``cache_salt`` in ``LLM`` prompt dicts (vLLM's ``{"prompt": ..., "cache_salt": ...}`` and
``{"prompt_token_ids": ..., "cache_salt": ...}``) and ``annotate`` documents: hits only within
a salt (``num_cached_tokens``), the same text as without the cache; a bad salt raises naming
the prompt and the field, or (``generate_iter``) is that item's error alone."""

from __future__ import annotations

import pytest

from mlxpa import LLM, SamplingParams
from tests.entrypoints.conftest import KV_BYTES

PROMPT = "The committee met on Tuesday to review the budget for the new library wing. " * 2
PARAMS = SamplingParams(max_tokens=4)
QUESTIONS = [{"name": "mood", "type": "choice", "labels": ["calm", "tense"],
              "template": "\nMood: "}]


@pytest.fixture(scope="module")
def llm(folder):
    return LLM(folder, kv_cache_memory_bytes=KV_BYTES, block_size=16)


def test_dict_prompts_hit_only_their_own_salt(llm, folder):
    ids = llm.get_tokenizer().encode(PROMPT)
    prompts = [{"prompt": PROMPT, "cache_salt": "alice"},
               {"prompt": PROMPT, "cache_salt": "bob"},
               {"prompt_token_ids": ids, "cache_salt": "alice"},
               {"prompt": PROMPT},
               {"prompt_token_ids": ids, "cache_salt": "bob"},
               {"prompt": PROMPT, "cache_salt": "carol"}]
    outs = llm.generate(prompts, PARAMS, use_tqdm=False)
    hit = (len(ids) - 1) // 16 * 16
    cached = [o.num_cached_tokens for o in outs]
    # per salt, the first row in prefix order computes the prompt and the next one hits it
    assert sorted(cached[:3:2]) == [0, hit] and sorted(cached[1:5:3]) == [0, hit]
    assert cached[3] == cached[5] == 0 and hit >= 128
    # the model with the prefix cache off gives the same tokens
    off = LLM(folder, kv_cache_memory_bytes=KV_BYTES, block_size=16, enable_prefix_caching=False)
    want = off.generate([PROMPT], PARAMS, use_tqdm=False)[0].outputs[0].token_ids
    assert all(o.outputs[0].token_ids == want for o in outs)


def test_a_bad_salt_names_the_prompt_and_the_field(llm):
    with pytest.raises(ValueError, match=r'prompts\[1\]: field "cache_salt" must be a '
                       r"non-empty string of at most 256 characters, got 3"):
        llm.generate([{"prompt": "a"}, {"prompt": "b", "cache_salt": 3}], PARAMS)
    items = [{"prompt": "a", "cache_salt": ""}, {"prompt": "b", "cache_salt": "ok"}]
    outs = list(llm.generate_iter(items, PARAMS))
    assert outs[0].error == ('prompts[0]: field "cache_salt" must be a non-empty string of at '
                             'most 256 characters, got ""')
    assert outs[1].error is None and outs[1].outputs[0].token_ids


def test_annotate_documents_are_salted_rows(llm):
    docs = [{"prompt": PROMPT, "cache_salt": "x"}, {"prompt": PROMPT, "cache_salt": "y"},
            {"prompt": PROMPT, "cache_salt": "x"}]
    outs = llm.annotate(docs, QUESTIONS, use_tqdm=False)
    assert [o.error for o in outs] == [None] * 3
    cached = [o.num_cached_tokens for o in outs]
    assert cached[1] == 0 and sorted(cached[::2])[0] == 0 and sorted(cached[::2])[1] > 0
    for out in outs[1:]:
        assert out.outputs["mood"].label == outs[0].outputs["mood"].label
        assert out.outputs["mood"].logprobs == pytest.approx(outs[0].outputs["mood"].logprobs,
                                                             abs=1e-4)
    with pytest.raises(ValueError, match=r'documents\[0\]: field "cache_salt"'):
        llm.annotate([{"prompt": PROMPT, "cache_salt": ["x"]}], QUESTIONS)
