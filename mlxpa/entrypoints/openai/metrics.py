"""``GET /metrics``: the server's Prometheus text (``prometheus-client``), vLLM's metric names
where vLLM has the metric, ``mlxpa:`` names where it has none, every one labelled with
``model_name``.

Read from the engine thread's :class:`~mlxpa.engine.async_llm.EngineStats` at each scrape:
``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``
(blocks held by requests over usable blocks at the pool's ceiling, 0 to 1),
``mlxpa:kv_blocks_in_use``, ``mlxpa:kv_blocks_total`` (at the ceiling), the pool held now and
its ceiling (``mlxpa:kv_pool_blocks``, ``mlxpa:kv_pool_bytes``,
``mlxpa:kv_pool_ceiling_bytes``; the counters ``mlxpa:kv_pool_growths_total`` and
``mlxpa:kv_pool_releases_total``), ``mlxpa:kv_cache_peak_bytes`` (KV held at peak, every KV
cache group) and ``mlxpa:kv_cache_peak_bytes_by_group`` (by ``group``: ``full_attention``,
``sliding_window_<n>``, ``recurrent``), and the counters ``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total``, ``vllm:prefix_cache_queries_total`` (prompt tokens looked up)
and ``vllm:prefix_cache_hits_total`` (of those, served from the cache),
``vllm:num_preemptions_total``; the disk KV tier's (``--kv-cache-dir``; 0 when off)
``mlxpa:prefix_cache_disk_hits_total`` (of the hits, prompt tokens read from disk),
``mlxpa:kv_disk_blocks_read_total``, ``mlxpa:kv_disk_bytes_read_total``,
``mlxpa:kv_disk_blocks_written_total``, ``mlxpa:kv_disk_bytes_written_total``,
``mlxpa:kv_disk_invalid_files_total`` and the gauges ``mlxpa:kv_disk_blocks`` and
``mlxpa:kv_disk_bytes`` (the folder's files and bytes); and speculative decoding's
``vllm:spec_decode_num_drafts_total``, ``vllm:spec_decode_num_draft_tokens_total``,
``vllm:spec_decode_num_accepted_tokens_total`` and
``vllm:spec_decode_num_accepted_tokens_per_pos_total`` (by ``position``). Observed as each
sample finishes: the histograms
``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
``vllm:e2e_request_latency_seconds``, and ``vllm:request_success_total`` by
``finished_reason``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from mlxpa.engine.async_llm import AsyncLLM
from mlxpa.request import SampleOutput

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# vLLM's buckets (seconds), cut to what a CPU or a Mac sees.
TTFT_BUCKETS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0)


class _EngineCollector(Collector):
    """The gauges and counters of the engine's latest :class:`EngineStats`."""

    def __init__(self, llm: AsyncLLM, model_name: str) -> None:
        self.llm, self.labels = llm, [model_name]

    def collect(self):
        s = self.llm.stats
        c = s.counters
        gauges = (("vllm:num_requests_running", "Requests running (samples).", s.num_running),
                  ("vllm:num_requests_waiting", "Requests waiting.", self.llm.num_waiting()),
                  ("vllm:kv_cache_usage_perc", "KV blocks held by requests over usable "
                   "blocks at the pool's ceiling (1 = full).",
                   s.kv_blocks_in_use / max(s.kv_blocks_total, 1)),
                  ("mlxpa:kv_blocks_in_use", "KV blocks held by requests.", s.kv_blocks_in_use),
                  ("mlxpa:kv_blocks_total", "Usable KV blocks of the pool at its ceiling.",
                   s.kv_blocks_total),
                  ("mlxpa:kv_pool_blocks", "Usable KV blocks the pool holds now (it grows by "
                   "segments up to its ceiling and gives them back when idle).",
                   s.kv_pool_blocks),
                  ("mlxpa:kv_pool_bytes", "Bytes of the KV pool held now.", s.kv_pool_bytes),
                  ("mlxpa:kv_pool_ceiling_bytes", "Bytes of the KV pool at its ceiling "
                   "(the KV memory budget).", s.kv_pool_ceiling_bytes),
                  ("mlxpa:kv_cache_peak_bytes", "Most bytes of KV held at once since start, "
                   "every KV cache group.", c.peak_kv_bytes),
                  ("mlxpa:kv_disk_blocks", "Block files in the disk KV tier's folder.",
                   c.disk_files),
                  ("mlxpa:kv_disk_bytes", "Bytes of the disk KV tier's files.", c.disk_bytes))
        for name, doc, value in gauges:
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric(self.labels, value)
            yield g
        counters = (("vllm:prompt_tokens", "Prompt tokens admitted.", c.prompt_tokens),
                    ("vllm:generation_tokens", "Output tokens sampled.", c.generation_tokens),
                    ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix "
                     "cache.", c.prompt_tokens),
                    ("vllm:prefix_cache_hits", "Prompt tokens served from the prefix cache.",
                     c.cached_prompt_tokens),
                    ("vllm:num_preemptions", "Requests preempted.", c.num_preemptions),
                    ("mlxpa:prefix_cache_disk_hits", "Prompt tokens served from the disk KV "
                     "tier (of vllm:prefix_cache_hits).", c.disk_cached_prompt_tokens),
                    ("mlxpa:kv_disk_blocks_read", "Block positions read back from the disk "
                     "KV tier.", c.disk_blocks_read),
                    ("mlxpa:kv_disk_bytes_read", "Bytes read from the disk KV tier.",
                     c.disk_bytes_read),
                    ("mlxpa:kv_disk_blocks_written", "Block positions written to the disk KV "
                     "tier.", c.disk_blocks_written),
                    ("mlxpa:kv_disk_bytes_written", "Bytes written to the disk KV tier.",
                     c.disk_bytes_written),
                    ("mlxpa:kv_disk_invalid_files", "Disk KV tier files skipped as invalid "
                     "(removed; their tokens computed).", c.disk_invalid_files),
                    ("mlxpa:kv_pool_growths", "Steps that grew the KV pool.",
                     c.kv_pool_growths),
                    ("mlxpa:kv_pool_releases", "Times the idle KV pool gave its segments "
                     "back but one.", c.kv_pool_releases),
                    ("vllm:spec_decode_num_drafts", "Request steps that verified draft "
                     "tokens.", c.spec.num_drafts),
                    ("vllm:spec_decode_num_draft_tokens", "Draft tokens verified.",
                     c.spec.num_draft_tokens),
                    ("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                     c.spec.num_accepted_tokens))
        for name, doc, value in counters:
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(self.labels, value)
            yield family
        by_group = GaugeMetricFamily(
            "mlxpa:kv_cache_peak_bytes_by_group", "Most bytes of KV held at once since start, "
            "per kind of KV cache group.", labels=["model_name", "group"])
        for group, value in c.peak_kv_bytes_by_group.items():
            by_group.add_metric([*self.labels, group], value)
        yield by_group
        per_pos = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted at each draft position (0 first).",
            labels=["model_name", "position"])
        for pos, value in enumerate(c.spec.num_accepted_tokens_per_pos):
            per_pos.add_metric([*self.labels, str(pos)], value)
        yield per_pos


class ServerMetrics:
    """The server's registry: the engine's figures and the per-request histograms.

    Args:
        llm: The engine (its stats are read at each scrape).
        model_name: The ``model_name`` label.
    """

    def __init__(self, llm: AsyncLLM, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Seconds from arrival to the first token.", labels,
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.itl = Histogram("vllm:inter_token_latency_seconds",
                             "Seconds between consecutive output tokens.", labels,
                             buckets=ITL_BUCKETS, registry=self.registry)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Seconds from arrival to the last output.", labels,
                             buckets=E2E_BUCKETS, registry=self.registry)
        self.success = Counter("vllm:request_success", "Samples finished, by reason.",
                               [*labels, "finished_reason"], registry=self.registry)
        self.registry.register(_EngineCollector(llm, model_name))

    def on_finished(self, out: SampleOutput, e2e_s: float) -> None:
        """Observe a finished sample (called in the engine thread)."""
        name = self.model_name
        if out.ttft_s is not None:
            self.ttft.labels(name).observe(out.ttft_s)
        itl = self.itl.labels(name)
        for gap in out.itl_s:
            itl.observe(gap)
        self.e2e.labels(name).observe(e2e_s)
        self.success.labels(name, out.finish_reason or "abort").inc()

    def on_aborted(self, num_samples: int) -> None:
        """Count the samples of a request its client left (called in the engine thread)."""
        self.success.labels(self.model_name, "abort").inc(num_samples)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
