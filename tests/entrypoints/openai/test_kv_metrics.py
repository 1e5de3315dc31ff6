"""``/metrics`` reports the KV held at peak, in all and per kind of KV cache group, equal to
the engine's own counters (the metrics JSON's ``peak_kv_bytes`` and
``peak_kv_bytes_by_group``)."""

from __future__ import annotations

import httpx

from tests.entrypoints.openai.conftest import NAME


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
