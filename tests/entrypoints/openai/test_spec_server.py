"""Speculative decoding through the entry points: ``mlxpa serve`` with
``speculative_config`` streams the texts of ``LLM`` without it, and ``/metrics`` reports
vLLM's ``vllm:spec_decode_*`` counters; ``LLM(speculative_config=...)`` gives ``LLM``'s
texts."""

from __future__ import annotations

import pytest

from mlxpa.sampling_params import SamplingParams
from tests.entrypoints.openai.conftest import ENGINE, NAME, running_server

SPEC = {"method": "suffix", "num_speculative_tokens": 4}
PROMPT = "hello hello hello world"


def test_server_streams_plain_texts_and_counts_drafts(folder, oracle):
    from openai import OpenAI

    want = oracle.generate([PROMPT], SamplingParams(max_tokens=40), use_tqdm=False)[0]
    with running_server(folder, engine={"speculative_config": SPEC}) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                        timeout=60)
        for _ in range(3):  # later requests draft from the earlier ones' finished outputs
            pieces = [c.choices[0].text for c in client.completions.create(
                model=NAME, prompt=PROMPT, max_tokens=40, temperature=0, stream=True)]
            assert "".join(pieces) == want.outputs[0].text
        m = server.metrics()
    drafted = m["vllm:spec_decode_num_draft_tokens_total"]
    accepted = m["vllm:spec_decode_num_accepted_tokens_total"]
    assert m["vllm:spec_decode_num_drafts_total"] > 0
    assert 0 < accepted <= drafted
    # position 0 is the first sample of the per-position family: at most every draft step
    assert 0 < m["vllm:spec_decode_num_accepted_tokens_per_pos_total"] \
        <= m["vllm:spec_decode_num_drafts_total"]


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_llm_speculative_config_keeps_texts(folder, oracle, method):
    from mlxpa import LLM

    prompts = [PROMPT, "abcabcabcabc", "the cat the cat the"]
    params = SamplingParams(max_tokens=32)
    want = [o.outputs[0].text for o in oracle.generate(prompts, params, use_tqdm=False)]
    llm = LLM(folder, **ENGINE, speculative_config={"method": method})
    got = [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
    assert llm.llm_engine.config.speculative_config.method == method
