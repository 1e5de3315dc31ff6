"""Counters of many replicas: per-shard deltas from each engine, summed on the driver.

Pure Python (no mlx, no ray). A replica sends, with every shard it finishes, how much its
engine's :class:`~mlxpa.engine.metrics.Counters` grew while running that shard (plus its
current peak KV blocks and the seconds its model took to load); the driver adds these deltas
into one ``Counters`` (the progress bar and the final :class:`~mlxpa.engine.metrics.Stats`
read it) and keeps the peak KV blocks per replica, since peaks on different machines do not
add up to a peak of anything.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlxpa.engine.metrics import Counters, Stats

ADDITIVE = ("requests", "prompt_tokens", "cached_prompt_tokens", "generation_tokens",
            "num_preemptions", "evicted_blocks", "num_steps", "kv_tokens_held",
            "kv_slots_in_use", "failed_rows")


def snapshot(c: Counters) -> dict[str, Any]:
    """Where ``c`` stands now: its additive fields and the lengths of its latency lists."""
    return {**{k: getattr(c, k) for k in ADDITIVE}, "ttft": len(c.ttft_s), "itl": len(c.itl_s)}


def delta(c: Counters, before: dict[str, Any], replica: str, process: str,
          load_s: float) -> dict[str, Any]:
    """What ``c`` gained since ``snapshot`` returned ``before``, as a JSON-able dict.

    Args:
        c: A replica engine's counters.
        before: ``snapshot(c)`` taken when the shard started.
        replica: The replica's name (its Ray actor id, kept when Ray restarts it).
        process: The replica's process (``host:pid``; new after a restart).
        load_s: Seconds the replica's model took to load (``LLMEngine`` construction).
    """
    out: dict[str, Any] = {k: getattr(c, k) - before[k] for k in ADDITIVE}
    out.update(ttft_s=c.ttft_s[before["ttft"]:], itl_s=c.itl_s[before["itl"]:],
               peak_kv_blocks=c.peak_kv_blocks, replica=replica, process=process,
               load_s=load_s)
    return out


@dataclasses.dataclass(slots=True)
class ClusterCounters:
    """The driver's sum over replicas.

    Attributes:
        counters: Sums of every replica's counters (``peak_kv_blocks``: the largest replica
            peak); ``start_time`` is when the driver started the Ray pipeline.
        peak_kv_blocks: Peak KV blocks of each replica, by replica name.
        load_s: Model load seconds of each replica process, by ``host:pid`` (a replica that
            died and was restarted by Ray loads again in a new process).
    """

    counters: Counters = dataclasses.field(default_factory=Counters)
    peak_kv_blocks: dict[str, int] = dataclasses.field(default_factory=dict)
    load_s: dict[str, float] = dataclasses.field(default_factory=dict)

    def add(self, d: dict[str, Any]) -> None:
        """Add one shard's :func:`delta`."""
        c = self.counters
        for k in ADDITIVE:
            setattr(c, k, getattr(c, k) + d[k])
        c.ttft_s.extend(d["ttft_s"])
        c.itl_s.extend(d["itl_s"])
        name = d["replica"]
        self.peak_kv_blocks[name] = max(self.peak_kv_blocks.get(name, 0), d["peak_kv_blocks"])
        c.peak_kv_blocks = max(self.peak_kv_blocks.values())
        self.load_s[d["process"]] = d["load_s"]


def cluster_metrics(stats: Stats, cluster: ClusterCounters, extra: dict[str, Any]) -> dict:
    """``--metrics-json`` of a Ray run: a local run's keys, ``peak_kv_blocks`` as the list of
    per-replica peaks, then ``num_replicas``, ``replica_load_s`` (per replica process, named in
    ``replica_processes`` as ``host:pid``) and the
    driver's timings in ``extra``."""
    out = stats.to_dict()
    out["peak_kv_blocks"] = list(cluster.peak_kv_blocks.values())
    out["num_replicas"] = len(cluster.peak_kv_blocks)
    out["replica_load_s"] = list(cluster.load_s.values())
    out["replica_processes"] = list(cluster.load_s)
    out.update(extra)
    return out
