"""``/metrics`` reports the KV held at peak, in all and per kind of KV cache group, equal to
the engine's own counters (the metrics JSON's ``peak_kv_bytes`` and
``peak_kv_bytes_by_group``), and the KV pool held now against its ceiling as it grows and is
given back."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from mlxpa import SamplingParams
from tests.entrypoints.conftest import KV_BYTES
from tests.entrypoints.openai.conftest import NAME, running_server


def test_peak_kv_bytes_match_the_engine_counters(server):
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "model": NAME, "prompt": "hello hello hello", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200
    m = server.wait_idle()
    counters = server.llm.stats.counters
    assert counters.peak_kv_bytes > 0
    assert m["mlxpa:kv_cache_peak_bytes"] == counters.peak_kv_bytes
    first_group, first_bytes = next(iter(counters.peak_kv_bytes_by_group.items()))
    text = httpx.get(server.url + "/metrics", timeout=10).text
    assert f'mlxpa:kv_cache_peak_bytes_by_group{{group="{first_group}",model_name="{NAME}"}} ' \
        f"{float(first_bytes)}" in text


def test_the_pool_held_now_grows_under_load_and_goes_back_when_idle(folder, oracle):
    """``/metrics`` says what the pool holds now and its ceiling: one segment at start, more
    while concurrent requests run (their texts the oracle's), one segment again
    ``kv_release_after`` seconds after the last step."""
    block = 8192  # bytes of a block of the tiny llama (16 tokens)
    engine = {"kv_segment_bytes": 3 * block, "kv_release_after": 0.5}
    prompts = ["the cat sat on the mat " * 2, "hello world, " * 4, "0123456789" * 3, "ab " * 9]
    want = oracle.generate(prompts, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    with running_server(folder, engine=engine) as server:
        m = server.metrics()
        assert (m["mlxpa:kv_pool_blocks"], m["mlxpa:kv_pool_bytes"]) == (2, 3 * block)
        assert m["mlxpa:kv_pool_ceiling_bytes"] == (KV_BYTES // block + 1) * block
        assert m["mlxpa:kv_blocks_total"] == KV_BYTES // block

        def one(prompt: str) -> str:
            r = httpx.post(server.url + "/v1/completions", timeout=60, json={
                "model": NAME, "prompt": prompt, "max_tokens": 8, "temperature": 0})
            return r.json()["choices"][0]["text"]

        with ThreadPoolExecutor(len(prompts)) as pool:
            texts = list(pool.map(one, prompts))
        assert texts == [w.outputs[0].text for w in want]
        assert server.metrics()["mlxpa:kv_pool_growths_total"] >= 1
        deadline = time.monotonic() + 30
        while (m := server.metrics())["mlxpa:kv_pool_releases_total"] < 1:
            assert time.monotonic() < deadline, m
            time.sleep(0.05)
        assert (m["mlxpa:kv_pool_blocks"], m["mlxpa:kv_pool_bytes"]) == (2, 3 * block)
        assert m["vllm:num_requests_running"] == 0 and m["mlxpa:kv_blocks_in_use"] == 0
