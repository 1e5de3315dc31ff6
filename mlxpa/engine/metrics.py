"""Monotone engine counters and the statistics derived from them.

The engine only increments :class:`Counters`; :func:`summarize` turns them into
:class:`Stats` (tokens per second, KV utilisation, TTFT / ITL percentiles) that the progress
bar, the final report and ``--metrics-json`` read (mlx-lm's ``BatchCounters`` idea: the
engine never draws).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass(slots=True)
class SpecDecodingStats:
    """Speculative decoding's counts (vLLM's ``SpecDecodingStats``).

    Attributes:
        num_drafts: Request steps that verified draft tokens.
        num_draft_tokens: Draft tokens verified.
        num_accepted_tokens: Draft tokens accepted.
        num_accepted_tokens_per_pos: Per draft position (0 first), the drafts accepted there.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def record(self, out, sampled: list[list[int]]) -> None:
        """The drafts a step verified (``out.spec_token_ids``) and what each request emitted
        (``sampled``, per request that sampled in ``out.requests`` order)."""
        emitted = iter(sampled)
        for req, samples in zip(out.requests, out.sampling):
            tokens = next(emitted) if samples else []
            drafts = out.spec_token_ids.get(req.key)
            if not drafts:
                continue
            accepted = min(max(len(tokens) - 1, 0), len(drafts))
            self.num_drafts += 1
            self.num_draft_tokens += len(drafts)
            self.num_accepted_tokens += accepted
            per_pos = self.num_accepted_tokens_per_pos
            per_pos.extend([0] * (len(drafts) - len(per_pos)))
            for j in range(accepted):
                per_pos[j] += 1


@dataclass(slots=True)
class Counters:
    """Counters the engine increments (never decrements).

    Attributes:
        start_time: ``perf_counter`` seconds when the engine started its first step.
        requests: Requests finished (errors included).
        prompt_tokens: Prompt tokens of admitted requests (counted once each).
        cached_prompt_tokens: Prompt tokens served from the prefix cache.
        generation_tokens: Output tokens sampled.
        num_preemptions: Requests preempted (recomputed later).
        evicted_blocks: Blocks evicted from the prefix cache (radix tree).
        num_steps: Engine steps run.
        peak_kv_blocks: Most KV blocks held by requests after any step (blocks only the
            prefix cache holds are evictable and not counted, as in vLLM).
        peak_kv_bytes: Most bytes of KV held at once, every group (blocks held by requests
            and snapshots the tree must keep; a recurrent model's live states too).
        peak_kv_bytes_by_group: The same per kind of KV cache group (``full_attention``,
            ``sliding_window_<window>``, ``recurrent``), each its own peak.
        peak_running: Most requests running at once (admitted, holding blocks).
        kv_tokens_held: Sum over steps of tokens with K/V in the pool.
        kv_slots_in_use: Sum over steps of ``blocks in use * block_size``.
        ttft_s: Time to first token of each finished request, seconds.
        itl_s: Inter-token latencies of all finished requests, seconds.
        failed_rows: Input rows whose result is an error row (invalid, or unable to run).
        mask_time_s: Seconds spent filling grammar bitmasks (structured outputs; the
            runner's ``StepResult.mask_time_s``).
        mask_steps: Steps that filled at least one grammar bitmask.
        scored_tokens: Tokens scored without being sampled: scored prompt tokens and target
            ids (a choice row's label tokens).
        spec: Speculative decoding's counts (:class:`SpecDecodingStats`).
        disk_on: The disk KV tier is on (``--kv-cache-dir``); the ``disk_*`` fields count it.
        disk_cached_prompt_tokens: Of ``cached_prompt_tokens``, those read back from disk.
        disk_blocks_read, disk_bytes_read: Block positions (files) read and verified, bytes.
        disk_blocks_written, disk_bytes_written: Block positions written, bytes.
        disk_snapshots_read, disk_snapshots_written: Of those positions, files holding a
            recurrent snapshot (hybrid and state-space models).
        disk_invalid_files: Files skipped as invalid (removed; their tokens computed).
        disk_files_removed: Files removed to keep the folder within its bound.
        disk_files, disk_bytes: Files and bytes in the folder now (gauges).
        kv_pool_growths: Steps that grew the KV pool by segments.
        kv_pool_releases: Times an idle KV pool gave its segments back but one.
    """

    start_time: float = field(default_factory=time.perf_counter)
    requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generation_tokens: int = 0
    num_preemptions: int = 0
    evicted_blocks: int = 0
    num_steps: int = 0
    peak_kv_blocks: int = 0
    peak_kv_bytes: int = 0
    peak_kv_bytes_by_group: dict[str, int] = field(default_factory=dict)
    peak_running: int = 0
    kv_tokens_held: int = 0
    kv_slots_in_use: int = 0
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    failed_rows: int = 0
    mask_time_s: float = 0.0
    mask_steps: int = 0
    scored_tokens: int = 0
    spec: SpecDecodingStats = field(default_factory=lambda: SpecDecodingStats())
    disk_on: bool = False
    disk_cached_prompt_tokens: int = 0
    disk_blocks_read: int = 0
    disk_bytes_read: int = 0
    disk_blocks_written: int = 0
    disk_bytes_written: int = 0
    disk_snapshots_read: int = 0
    disk_snapshots_written: int = 0
    disk_invalid_files: int = 0
    disk_files_removed: int = 0
    disk_files: int = 0
    disk_bytes: int = 0
    kv_pool_growths: int = 0
    kv_pool_releases: int = 0

    def record_step(self, num_sampled: int, num_preempted: int, evicted_blocks: int,
                    mask_time_s: float | None) -> None:
        """One engine step: tokens it sampled, requests it preempted, the prefix cache's
        evictions so far, its grammar mask time (None: no constrained row)."""
        self.num_steps += 1
        self.generation_tokens += num_sampled
        self.num_preemptions += num_preempted
        self.evicted_blocks = evicted_blocks
        if mask_time_s is not None:
            self.mask_time_s += mask_time_s
            self.mask_steps += 1

    def record_kv(self, out, kv, running: list, block_bytes: int, snapshot_bytes: int) -> None:
        """KV use while step ``out`` runs (before ``update_from_output`` frees what finishes
        in it: a choice row's requests hold their blocks for one step or a few): ``kv`` the
        KV cache manager, ``running`` its running requests, the bytes of a block and of a
        live recurrent state."""
        scheduled = dict(zip(out.requests, out.num_scheduled_tokens))
        tokens, slots = kv.held_tokens_and_slots(
            running, [r.num_computed_tokens + scheduled.get(r, 0) for r in running])
        held = kv.held_bytes(block_bytes, len(running) * snapshot_bytes)
        self.peak_kv_blocks = max(self.peak_kv_blocks, kv.num_active_blocks)
        self.peak_running = max(self.peak_running, len(running))
        self.kv_tokens_held += tokens
        self.kv_slots_in_use += slots
        self.peak_kv_bytes = max(self.peak_kv_bytes, sum(held.values()))
        for kind, nbytes in held.items():
            self.peak_kv_bytes_by_group[kind] = max(self.peak_kv_bytes_by_group.get(kind, 0),
                                                    nbytes)


@dataclass(frozen=True, slots=True)
class Stats:
    """Derived figures (the keys of ``--metrics-json``)."""

    requests: int
    prompt_tokens: int
    cached_prompt_tokens: int
    prefix_cache_hit_rate: float
    generation_tokens: int
    elapsed_s: float
    total_tokens_per_s: float
    output_tokens_per_s: float
    requests_per_s: float
    peak_kv_blocks: int
    kv_utilization: float
    num_preemptions: int
    evicted_blocks: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    failed_rows: int = 0
    mask_ms_per_step: float | None = None  # bitmask fill per step with constrained rows
    mask_steps: int = 0
    scored_tokens: int = 0
    spec_decoding: dict | None = None  # SpecDecodingStats' fields; None without drafts
    peak_kv_bytes: int = 0
    peak_kv_bytes_by_group: dict[str, int] = field(default_factory=dict)
    disk_cached_prompt_tokens: int = 0  # of cached_prompt_tokens, read back from disk
    kv_disk: dict | None = None  # the disk KV tier's counts; None when it is off

    def to_dict(self) -> dict:
        return asdict(self)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) of ``values`` with linear interpolation between the
    closest ranks (``numpy.percentile``'s default, as vLLM's benchmarks report); None for no
    values. The one definition behind every published ``*_p50_s`` / ``*_p99_s``."""
    return float(np.percentile(values, q)) if values else None


def summarize(c: Counters, now: float | None = None) -> Stats:
    """Derive :class:`Stats` from counters at time ``now`` (``perf_counter`` seconds)."""
    elapsed = max((now or time.perf_counter()) - c.start_time, 1e-9)
    return Stats(
        requests=c.requests, prompt_tokens=c.prompt_tokens,
        cached_prompt_tokens=c.cached_prompt_tokens,
        prefix_cache_hit_rate=c.cached_prompt_tokens / c.prompt_tokens if c.prompt_tokens else 0.0,
        generation_tokens=c.generation_tokens,
        elapsed_s=elapsed,
        total_tokens_per_s=(c.prompt_tokens + c.generation_tokens) / elapsed,
        output_tokens_per_s=c.generation_tokens / elapsed,
        requests_per_s=c.requests / elapsed,
        peak_kv_blocks=c.peak_kv_blocks,
        kv_utilization=c.kv_tokens_held / c.kv_slots_in_use if c.kv_slots_in_use else 0.0,
        num_preemptions=c.num_preemptions, evicted_blocks=c.evicted_blocks,
        ttft_p50_s=percentile(c.ttft_s, 50), ttft_p99_s=percentile(c.ttft_s, 99),
        itl_p50_s=percentile(c.itl_s, 50), itl_p99_s=percentile(c.itl_s, 99),
        failed_rows=c.failed_rows,
        mask_ms_per_step=1e3 * c.mask_time_s / c.mask_steps if c.mask_steps else None,
        mask_steps=c.mask_steps, scored_tokens=c.scored_tokens, peak_kv_bytes=c.peak_kv_bytes,
        peak_kv_bytes_by_group=dict(c.peak_kv_bytes_by_group),
        spec_decoding=asdict(c.spec) if c.spec.num_drafts else None,
        disk_cached_prompt_tokens=c.disk_cached_prompt_tokens, kv_disk=_kv_disk(c))


_DISK_KEYS = ("blocks_read", "bytes_read", "blocks_written", "bytes_written", "snapshots_read",
              "snapshots_written", "invalid_files", "files_removed", "files", "bytes")


def _kv_disk(c: Counters) -> dict | None:
    """The disk tier's counts (``files``/``bytes``: in the folder now), or None when off."""
    return {k: getattr(c, f"disk_{k}") for k in _DISK_KEYS} if c.disk_on else None
