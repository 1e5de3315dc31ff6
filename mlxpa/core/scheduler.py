"""Continuous batching with chunked prefill and preemption by recompute.

Pure Python (no mlx). The design follows vLLM v1's scheduler at nano-vllm's size: there are
no separate prefill and decode phases, only ``num_computed_tokens`` catching up with
``num_tokens``. Each step spends a token budget (``max_num_batched_tokens``) first on running
requests in admission order (one token for a decode, a chunk for an unfinished prefill),
then admits waiting requests while blocks, sequence slots and budget last. When blocks run
out, the most recently admitted running request is preempted (its blocks freed; it goes back
to the head of the waiting queue and is recomputed later, LIFO as in vLLM). A preempted
request, or one whose prompt takes more than one step's chunk, starts only when it and the
running requests can finish in the pool, or when the running requests cannot anyway
(:meth:`Scheduler._room_to_finish`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from mlxpa.config import EngineConfig
from mlxpa.core.common_prefix import CascadeGroup, common_prefix_groups
from mlxpa.core.kv_cache_manager import KVCacheManager
from mlxpa.core.kv_disk import KVLoad, KVSave
from mlxpa.core.radix_cache import PrefixMatch
from mlxpa.core.shared_prefix import shares_uncached_prefix, snapshot_points
from mlxpa.request import Request, RequestStatus
from mlxpa.spec_decode.gate import SpecGate

# How many waiting requests admission may pass over while they wait for a shared prefix.
_ADMISSION_LOOKAHEAD = 256


@dataclass(slots=True)
class SchedulerOutput:
    """One step's work, read by the model runner (which never mutates it). Every field is a
    value fixed by :meth:`Scheduler.schedule` (vLLM v1's ``SchedulerOutput``), so it reads the
    same before and after ``update_from_output`` advances the requests."""

    # Requests to run this step, decodes and prefill chunks mixed, in running order.
    requests: list[Request] = field(default_factory=list)
    # Tokens each request computes this step (1 for a decode, the chunk for a prefill).
    num_scheduled_tokens: list[int] = field(default_factory=list)
    # Their sum (the runner returns its empty result when 0).
    total_num_scheduled_tokens: int = 0
    # Per request: its chunk reaches its last token and it samples (not score_only), so a
    # token is sampled (the runner's LM-head rows, update_from_output's appends).
    sampling: list[bool] = field(default_factory=list)
    # Per request: its chunk reaches its last token (its prefill is done; a decode's always
    # does): the engine starts what waited for the prefill, a score_only request finishes.
    last_chunk: list[bool] = field(default_factory=list)
    # (src, dst) block copies to apply before the forward pass (copy-on-write).
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    # Requests preempted while building this step (their blocks are already free): the
    # runner drops their recurrent states.
    preempted: list[Request] = field(default_factory=list)
    # Recurrent snapshots: (request, blocks) to restore the request's state from before
    # the forward pass (a prefix hit's, a fork's), and to save its state into after it (the
    # step ends at one of its snapshot points).
    state_restores: list[tuple[Request, list[int]]] = field(default_factory=list)
    state_saves: list[tuple[Request, list[int]]] = field(default_factory=list)
    # Disk tier (mlxpa.core.kv_disk): block positions to save to disk, whose bytes the
    # runner reads before anything writes the pools (evicted blocks may be reused this
    # step), and bytes read from disk to write into fresh blocks before the forward pass.
    kv_saves: list[KVSave] = field(default_factory=list)
    kv_loads: list[KVLoad] = field(default_factory=list)
    # Requests finished since the previous step (vLLM's finished_req_ids): the runner frees
    # its state of them.
    finished: list[Request] = field(default_factory=list)
    # Requests sharing leading full blocks written before this step (decodes among
    # themselves, prefill chunks among themselves), as indices into `requests` and the
    # number of blocks (vLLM's num_common_prefix_blocks, per group): the runner may attend
    # over a group's prefix once for all its rows (cascade attention). Empty when cascade
    # attention is off.
    cascade_groups: list[CascadeGroup] = field(default_factory=list)
    # Per request key, the draft tokens it verifies this step after its last sampled token
    # (speculative decoding; vLLM's scheduled_spec_decode_tokens): counted in its
    # num_scheduled_tokens; requests without drafts are absent.
    spec_token_ids: dict[int, list[int]] = field(default_factory=dict)
    # Whether the runner proposes drafts after this step's sampling: the gate found that its
    # sampling rows, decoding next, could gain from them (SpecGate.worth_proposing).
    propose_drafts: bool = False
    # Blocks the KV pool holds for this step, the null block included (it grows by segments
    # as steps need blocks and shrinks when idle: the runner resizes its arrays before the
    # block copies when it grows, after them when it shrinks); None: unchanged.
    num_kv_blocks: int | None = None


class Scheduler:
    """Decides which requests compute which tokens each step.

    Args:
        config: Budgets (``max_num_seqs``, ``max_num_batched_tokens``).
        kv_cache_manager: The door to KV blocks.
        max_model_len: Longest prompt + output in tokens the model supports.
        eos_token_ids: Token ids that end a request (unless it sets ``ignore_eos``).
    """

    def __init__(self, config: EngineConfig, kv_cache_manager: KVCacheManager,
                 max_model_len: int, eos_token_ids: frozenset[int] = frozenset()) -> None:
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.enable_cascade_attention = not config.disable_cascade_attn
        self.kv_cache_manager = kv_cache_manager
        # The prefill chunk that sizing and admission count on (the budget without windows);
        # a chunk goes past it only into spare blocks.
        self._window_cap = (kv_cache_manager.layout.max_chunk_tokens
                            or config.max_num_batched_tokens)
        # A request alone must always fit, or preemption could loop forever.
        self.max_model_len = min(max_model_len, kv_cache_manager.capacity_tokens)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self._finished: list[Request] = []  # since the last schedule()
        self.kv_release_after = config.kv_release_after
        self._last_step = time.monotonic()
        spec = config.speculative_config
        # Drafts are verified only where rejected tokens roll back for free: paged K/V. A
        # recurrent state has taken the drafts in when they are rejected.
        self.spec_gate = (SpecGate(spec.num_speculative_tokens, spec.disable_by_batch_size)
                          if spec is not None and not kv_cache_manager.recurrent else None)

    def add_request(self, req: Request) -> None:
        """Queue ``req``; clamp its output so prompt + output fits ``max_model_len``.

        Raises:
            ValueError: The prompt is empty or leaves no room for one output token.
        """
        if not req.prompt_token_ids:
            raise ValueError("prompt is empty (0 tokens)")
        room = self.max_model_len - req.num_prompt_tokens
        if room < 1:
            which = ("the KV pool" if self.max_model_len == self.kv_cache_manager.capacity_tokens
                     else "the model context (--max-model-len)")
            raise ValueError(
                f"prompt has {req.num_prompt_tokens} tokens; the limit is "
                f"{self.max_model_len - 1} ({which} holds {self.max_model_len} tokens)")
        req.max_tokens = min(req.sampling_params.max_tokens, room)
        req.status = RequestStatus.WAITING
        self.waiting.append(req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def has_finished_requests(self) -> bool:
        """Whether requests finished since the last :meth:`schedule`, which the next step
        hands to the runner (``SchedulerOutput.finished``) so it frees their state."""
        return bool(self._finished)

    def schedule(self) -> SchedulerOutput:
        """Build one step: running requests first, then admissions from ``waiting``."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        k = self._num_drafts()
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = self._chunk(req, req.num_computed_tokens, budget)
            drafts = self._drafts(req, k, budget - n) if n == 1 else []
            n += len(drafts)
            while self.kv_cache_manager.allocate_slots(req, n) is None:
                if drafts:
                    n, drafts = n - len(drafts), []  # no drafts before preempting anyone
                    continue
                if n > self._window_cap:
                    n = self._window_cap  # a chunk past the cap only into spare blocks
                    continue
                if self.running[-1] is req and n > 1:
                    n = (n + 1) // 2  # a smaller chunk before preempting itself
                    continue
                victim = self.running.pop()
                self._preempt(victim, out)
                if victim is req:
                    break
            else:
                out.requests.append(req)
                out.num_scheduled_tokens.append(n)
                if drafts:
                    out.spec_token_ids[req.key] = drafts
                budget -= n
                i += 1
        if not out.preempted:
            budget = self._admit(out, budget)
        out.blocks_to_copy = self.kv_cache_manager.take_blocks_to_copy()
        out.state_saves, out.state_restores = self.kv_cache_manager.take_state_ops()
        out.kv_saves, out.kv_loads = self.kv_cache_manager.take_disk_ops()
        out.total_num_scheduled_tokens = sum(out.num_scheduled_tokens)
        out.last_chunk = [
            r.num_computed_tokens + n - len(out.spec_token_ids.get(r.key, ())) == r.num_tokens
            for r, n in zip(out.requests, out.num_scheduled_tokens)]
        out.sampling = [last and not r.score_only
                        for r, last in zip(out.requests, out.last_chunk)]
        out.finished, self._finished = self._finished, []
        if self.spec_gate is not None:
            out.propose_drafts = self.spec_gate.worth_proposing(
                [r.key for r, s in zip(out.requests, out.sampling) if s])
        if self.enable_cascade_attention:
            out.cascade_groups = self._cascade_groups(out)
        out.num_kv_blocks = self.kv_cache_manager.pool.num_blocks
        self._last_step = time.monotonic()
        return out

    def kv_release_due(self, now: float) -> float | None:
        """Seconds from ``now`` (``time.monotonic()``) until the KV pool's segments are due
        back, ``kv_release_after`` after the last step (0: due); None when there is nothing
        to give back (one segment held, requests in flight, or release off)."""
        pool = self.kv_cache_manager.pool
        if (self.kv_release_after < 0 or self.has_unfinished_requests()
                or pool.num_blocks <= pool.segment_blocks):
            return None
        return max(0.0, self._last_step + self.kv_release_after - now)

    def release_kv_memory(self) -> SchedulerOutput:
        """An empty step that shrinks the KV pool to one segment, keeping the cached blocks
        that fit (:meth:`KVCacheManager.shrink_pool`): its block copies, the pool's new size,
        and the requests finished since the last step (the runner frees their state).

        Raises:
            RuntimeError: Requests are in flight.
        """
        if self.has_unfinished_requests():
            raise RuntimeError("the KV pool is released only while no request is in flight")
        kv = self.kv_cache_manager
        out = SchedulerOutput(blocks_to_copy=kv.shrink_pool(kv.pool.segment_blocks))
        out.num_kv_blocks = kv.pool.num_blocks
        # the disk tier's saves of blocks the shrink evicted: read before the arrays shrink
        out.kv_saves, out.kv_loads = kv.take_disk_ops()
        out.finished, self._finished = self._finished, []
        return out

    def _num_drafts(self) -> int:
        """This step's most drafts per decode row (:class:`SpecGate`), 0 without speculation.
        Each running request's proposal is consumed here: a request left out of the step
        proposes again after its next sampled token."""
        if self.spec_gate is None:
            return 0
        rows = [(r.key, len(r.spec_token_ids)) for r in self.running
                if r.num_computed_tokens == r.num_tokens - 1]
        return self.spec_gate.num_drafts(rows)

    def _drafts(self, req: Request, k: int, budget: int) -> list[int]:
        """The drafts ``req`` verifies this step after its last token: at most ``k``, the
        token budget left and what its ``max_tokens`` leaves room for (each accepted draft is
        an output token, and one more token follows them)."""
        room = min(k, budget, req.max_tokens - req.num_output_tokens - 1)
        drafts, req.spec_token_ids = req.spec_token_ids[:max(room, 0)], []
        return drafts

    def _chunk(self, req: Request, start: int, budget: int) -> int:
        """Tokens ``req`` computes this step from position ``start``: the rest of it, at most
        ``budget`` and its chunk limit (its next snapshot point; a sliding window's cap, or
        past it into spare blocks)."""
        kv = self.kv_cache_manager
        n = min(req.num_tokens - start, budget)
        limit = kv.chunk_limit(req, start)
        if n > self._window_cap and limit == self._window_cap:
            limit = kv.chunk_limit(req, start, kv.spare_blocks(self.running, req))
        return n if limit is None else min(n, limit)

    def _cascade_groups(self, out: SchedulerOutput) -> list[CascadeGroup]:
        """The step's requests grouped by the leading full blocks they share
        (:func:`common_prefix_groups`) in the first full-attention group, as indices into
        ``out.requests``: decode requests (with their drafts) among themselves and prefill
        chunks among themselves (the runner runs the two kinds in separate batches). Only
        blocks written before this step count (a request's ``num_computed_tokens``), so a
        chunk never shares a block its own step computes. None without a full-attention
        group."""
        bs = self.kv_cache_manager.block_size
        full = self.kv_cache_manager.windows.index(None) if (
            None in self.kv_cache_manager.windows) else None
        if full is None:
            return []
        groups: list[CascadeGroup] = []
        verify = [n == 1 or r.key in out.spec_token_ids  # the runner's decode batch
                  for r, n in zip(out.requests, out.num_scheduled_tokens)]
        for decode in (True, False):
            kind = [i for i, v in enumerate(verify) if v == decode]
            if len(kind) < 2:
                continue
            reqs = [out.requests[i] for i in kind]
            groups.extend(CascadeGroup(tuple(kind[j] for j in g.indices), g.num_blocks)
                          for g in common_prefix_groups(
                              [r.block_tables[full] for r in reqs],
                              [r.num_computed_tokens // bs for r in reqs]))
        return groups

    def _admit(self, out: SchedulerOutput, budget: int) -> int:
        kv = self.kv_cache_manager
        deferred: list[Request] = []
        ends = {r: r.num_computed_tokens + n
                for r, n in zip(out.requests, out.num_scheduled_tokens)}
        # blocks the running requests need to finish: their sure outputs, their max_tokens
        need: int | None = None
        need_max = 0
        while (self.waiting and budget > 0 and len(self.running) < self.max_num_seqs
               and len(deferred) < _ADMISSION_LOOKAHEAD):
            req = self.waiting[0]
            hit = None
            if self.running:
                # decided on the memory tier's hit: a request held back plans no disk reads
                # (with no request running, none is deferred or held back)
                hit = kv.memory_hit(req)
                cached = hit.num_tokens if hit is not None else 0
                if shares_uncached_prefix(req, cached, self.running, kv, ends):
                    deferred.append(self.waiting.popleft())  # passed over, not a wall
                    continue
                if self._waits_for_room(req, cached):
                    if need is None:
                        need = sum(kv.blocks_to_finish(r, 1, _sure_outputs(r))
                                   for r in self.running)
                        need_max = sum(kv.blocks_to_finish(r, 1) for r in self.running)
                    if not self._room_to_finish(
                            req, need_max if req.num_preemptions else need, hit):
                        break
            self.waiting.popleft()
            computed = kv.get_computed_blocks(req, hit)
            if kv.recurrent:
                for point in snapshot_points(req, computed.num_tokens, self.waiting,
                                             self.running, kv):
                    kv.add_snapshot_point(req, point)
            n = self._chunk(req, computed.num_tokens, budget)
            while (allocated := kv.allocate_slots(req, n, computed)) is None and (
                    n > self._window_cap or not self.running and n > 1):
                # past the window cap only into spare blocks; alone in the pool, smaller
                n = self._window_cap if n > self._window_cap else (n + 1) // 2
            if allocated is None:
                self.waiting.appendleft(req)
                break
            req.num_computed_tokens = computed.num_tokens
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = computed.num_tokens
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            if need is not None:
                need += kv.blocks_to_finish(req, 1, _sure_outputs(req))
                need_max += kv.blocks_to_finish(req, 1)
            out.requests.append(req)
            out.num_scheduled_tokens.append(n)
            ends[req] = computed.num_tokens + n
            budget -= n
        self.waiting.extendleft(reversed(deferred))
        return budget

    def _waits_for_room(self, req: Request, cached: int) -> bool:
        """Whether ``req`` starts only with room to finish (:meth:`_room_to_finish`): it was
        preempted, or the part of its prompt past its ``cached`` tokens (its prefix hit in
        memory) takes more than one step's chunk."""
        return bool(req.num_preemptions) or (
            req.num_prompt_tokens - cached > self.max_num_batched_tokens)

    def _room_to_finish(self, req: Request, need: int, hit: PrefixMatch | None = None) -> bool:
        """Whether waiting ``req`` may start now: the available blocks cover what it and the
        running requests (``need``: theirs, :meth:`KVCacheManager.blocks_to_finish`) need to
        finish, or the running requests cannot all finish in them anyway (holding it back
        would only drain the batch).

        Asked for a preempted request and for one whose uncached prompt takes more than one
        step's chunk, where a preemption would throw away several steps of prefill: SGLang's
        admission reserve, where vLLM admits whatever chunk fits and preempts later (still the
        rule for short prompts, whose recompute costs at most a chunk). Started while the pool
        is a little short, a long prompt would be preempted near the end of the run, when
        every request holds its longest context, and computed again; a preempted one would
        prefill again and be preempted again (thrashing).

        A fresh request and the running ones are counted to the outputs they are sure to
        produce (:func:`_sure_outputs`: ``max_tokens`` when only the length ends them, else
        ``min_tokens``), so an EOS that may come early never holds a prompt back; a fresh
        request at its end (windows at their decode size: the running requests have still to
        grow while it prefills, and a chunk goes past the window cap only into spare blocks),
        less the full-attention blocks of its ``hit`` that running requests hold already. A
        preempted request keeps the stricter count it had: every request to its
        ``max_tokens``, and its own prefill chunks' windows."""
        kv = self.kv_cache_manager
        available = kv.num_available_blocks
        if req.num_preemptions:
            own = kv.blocks_to_finish(req, self.max_num_batched_tokens)
        else:
            own = kv.blocks_to_finish(req, 1, _sure_outputs(req)) - kv.held_hit_blocks(hit)
        return need > available or need + own <= available

    def expect_forks(self, parent: Request, position: int) -> None:
        """Requests will fork from ``parent`` at ``position`` once its prefill has run
        (:meth:`add_samples`): a recurrent model snapshots its state there."""
        self.kv_cache_manager.add_snapshot_point(parent, position, fork=True)

    def add_samples(self, parent: Request, children: list[Request]) -> None:
        """Start ``children`` (samples 1..n-1 of ``parent``'s prompt, or requests whose
        prompt extends it) within ``max_num_seqs``.

        As many children as there are free sequence slots fork ``parent``'s prompt blocks
        (:meth:`fork_request`; a recurrent model also its state, when the parent saved it
        where they start: :meth:`expect_forks`); the others join the waiting queue like any
        request and are admitted when slots and blocks allow, reading the prompt's full
        blocks from the prefix cache (vLLM v1 fans ``n`` out into independent requests the
        same way). A child's output does not depend on which way it starts: its seed comes
        from its identity.

        Args:
            parent: Sample 0, whose prefill has just run (its prompt K/V written).
            children: The other samples, in sample order.
        """
        for child in children:
            start = min(parent.num_prompt_tokens, child.num_prompt_tokens - 1)
            if (len(self.running) < self.max_num_seqs
                    and self.kv_cache_manager.can_fork(parent, start)):
                self.fork_request(parent, child)
            else:
                self.add_request(child)

    def fork_request(self, parent: Request, child: Request) -> None:
        """Start ``child``, whose prompt is ``parent``'s prompt or extends it, sharing the
        parent's prompt blocks.

        ``parent``'s prefill must have run (its prompt K/V written) and a sequence slot must
        be free (``len(running) < max_num_seqs``). The child shares every prompt block of
        the parent and computes only what follows: its own further prompt tokens (a scoring
        request: a prompt plus a label), or, with the parent's own prompt (another sample),
        the last prompt token again (to sample its own first token). The first write lands
        in the shared last block when that is partial, so the KV cache manager copies it
        first (copy-on-write) when the child is next scheduled.

        Raises:
            RuntimeError: No sequence slot is free.
        """
        if len(self.running) >= self.max_num_seqs:
            raise RuntimeError(f"fork would exceed max_num_seqs={self.max_num_seqs}")
        assert child.num_prompt_tokens >= parent.num_prompt_tokens
        child.num_computed_tokens = min(parent.num_prompt_tokens, child.num_prompt_tokens - 1)
        self.kv_cache_manager.fork(parent, child)
        child.max_tokens = min(child.sampling_params.max_tokens,
                               self.max_model_len - child.num_prompt_tokens)
        child.num_cached_tokens = parent.num_cached_tokens
        child.status = RequestStatus.RUNNING
        self.running.append(child)

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        req.spec_token_ids = []
        self.kv_cache_manager.free(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        out.preempted.append(req)

    def update_from_output(self, out: SchedulerOutput, sampled_token_ids: list[list[int]],
                           spec_token_ids: dict[int, list[int]] | None = None) -> list[Request]:
        """Advance computed tokens, append sampled tokens, finish on EOS or length.

        Args:
            out: The step that ran.
            sampled_token_ids: Per request whose ``out.sampling`` flag is True, in order, the
                tokens it emitted: one, or after drafts (``out.spec_token_ids``) the accepted
                drafts and the token after them (speculative decoding; vLLM's).
            spec_token_ids: Per request key, the drafts it proposes for its next step.

        Only the K/V of the last sampled token and the accepted drafts count as computed
        (the rejected drafts' slots are written over later, and only computed blocks enter
        the prefix cache). Tokens after an EOS, a stop token id or ``max_tokens`` are dropped.
        A ``score_only`` request whose prompt is computed finishes here (``stop``).

        Returns:
            Requests that received tokens this step (finished ones included; their blocks
            are already freed).
        """
        emitted = iter(sampled_token_ids)
        now = time.perf_counter()
        updated = []
        for req, n, last, samples in zip(out.requests, out.num_scheduled_tokens,
                                         out.last_chunk, out.sampling):
            drafts = out.spec_token_ids.get(req.key, ())
            tokens = next(emitted) if samples else []
            req.num_computed_tokens += n - len(drafts) + max(len(tokens) - 1, 0)
            if drafts and self.spec_gate is not None:
                self.spec_gate.observe(req.key, len(drafts), len(tokens) - 1)
            self.kv_cache_manager.cache_blocks(req)
            if last and req.score_only:
                self.finish_request(req, RequestStatus.FINISHED_STOPPED)
            if not samples:
                continue
            updated.append(req)
            for tok in tokens:
                if self._append(req, tok, now):
                    break
            if spec_token_ids and not req.is_finished:
                req.spec_token_ids = spec_token_ids.get(req.key, [])
        return updated

    def _append(self, req: Request, tok: int, now: float) -> bool:
        """Append one sampled token; return whether it finished ``req``."""
        req.output_token_ids.append(tok)
        req.token_times.append(now)
        sp = req.sampling_params
        if req.num_output_tokens > sp.min_tokens - 1 and (
                tok in sp.stop_token_ids or (tok in self.eos_token_ids and not sp.ignore_eos)):
            req.stop_reason = tok
            self.finish_request(req, RequestStatus.FINISHED_STOPPED)
        elif req.num_output_tokens >= req.max_tokens:
            self.finish_request(req, RequestStatus.FINISHED_LENGTH_CAPPED)
        return req.is_finished

    def finish_request(self, req: Request, status: RequestStatus) -> None:
        """Mark ``req`` finished and free its blocks (stop string, EOS, length, abort); the
        next step tells the runner (``SchedulerOutput.finished``)."""
        if req.is_finished:
            return
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status = status
        req.spec_token_ids = []
        if self.spec_gate is not None:
            self.spec_gate.forget(req.key)
        self.kv_cache_manager.free(req)
        self._finished.append(req)


def _sure_outputs(req: Request) -> int:
    """Output tokens ``req`` will have when it finishes, as far as is sure now: its
    ``max_tokens`` when nothing else can end it (``ignore_eos``, no stop strings or ids, no
    grammar), else ``min_tokens``; a ``score_only`` request samples none. At least the outputs
    it has."""
    sp = req.sampling_params
    if req.score_only:
        sure = 0
    elif (sp.ignore_eos and not sp.stop and not sp.stop_token_ids
          and sp.structured_outputs is None):
        sure = req.max_tokens
    else:
        sure = min(sp.min_tokens, req.max_tokens)
    return max(sure, req.num_output_tokens)
