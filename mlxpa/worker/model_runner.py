"""Model runner: the model checked once, the KV pool, step inputs, one forward pass per group
of requests, sampling.

Start-up has vLLM's two phases: the constructor probes the model and checks it against mlx-lm
once, and reports the bytes of one KV block (:attr:`ModelRunner.block_bytes`);
:meth:`ModelRunner.allocate_kv_cache` then builds the pool (vLLM's ``initialize_kv_cache``),
again whenever the engine rebuilds it. A step resizes the pool to the size the scheduler gives
it (``SchedulerOutput.num_kv_blocks``: a pool that grows by segments and shrinks when idle).

The runner reads a :class:`SchedulerOutput` and returns a :class:`StepResult`; it never mutates
requests, blocks or the scheduler. It owns the runner-side state of requests (block-table
copies, grammar matchers, penalty entries, recurrent states) and frees exactly what the
scheduler tells it (``finished`` and ``preempted``, vLLM's ``finished_req_ids``). Per step it:

1. frees that state, grows the pool when the step needs it, reads the blocks the disk tier
   saves (before anything writes the pools), writes the blocks it read back, applies
   copy-on-write block copies, and shrinks the pool after them (they may read there);
2. splits the scheduled requests into a decode group (one token each) and prefill groups of
   similar chunk length (requests of one group are right-padded to the group's longest chunk;
   padding a decode to a prefill chunk would cost the chunk's FLOPs);
3. builds per-group metadata with numpy (slot mapping, block tables, context lengths,
   positions, sliding-window tables) and converts it once;
4. runs each group's :class:`~mlxpa.worker.forward_plan.ForwardPlan` (tokens, metadata,
   and the positions read, by kind: sampled rows, scored prompt positions, targets), keeping
   the head's inputs there (:class:`~mlxpa.worker.forward_plan.StepReads`); the LM head
   runs only on those rows (Gemma 3's head over 262,144 tokens costs more than the rest of
   the 270M model);
5. samples (:class:`~mlxpa.worker.sampler.Sampler`) and evaluates everything (tokens, every
   written pool, the scored positions' head inputs, the targets' log-probabilities) in one
   ``mx.eval``; a step of several groups first evaluates each group but the last, so that the
   next group's pool writes can take over the pools' buffers instead of copying them. The
   scored tokens' log-probabilities are then read, the head applied in bounded slices
   (:func:`mlxpa.worker.logprobs.scored_logprobs`). A ``score_only`` request never samples:
   its last chunk's logits are read for its targets only.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import mlx.core as mx
import numpy as np

from mlxpa.config import DEFAULT_KV_SEGMENT_BYTES, EngineConfig, kv_budget_bytes
from mlxpa.core.disk_cache import DiskStore
from mlxpa.core.kv_disk import KVLoad, KVSave
from mlxpa.core.kv_sizing import num_kv_blocks
from mlxpa.core.scheduler import SchedulerOutput
from mlxpa.request import Request, TokenLogprob
from mlxpa.spec_decode import make_proposer
from mlxpa.structured.matchers import Grammars
from mlxpa.worker.block_tables import BlockTableCopies, written_blocks
from mlxpa.worker.drafter import Drafter
from mlxpa.worker.forward_plan import ForwardPlan, ReadKind, StepReads, group_reads
from mlxpa.worker.kv_cache import PagedKVCache
from mlxpa.worker.kv_storage import kv_storage
from mlxpa.worker.load_check import verify_and_split
from mlxpa.worker.logprobs import LogprobGather, scored_logprobs
from mlxpa.worker.model_probe import probe_model
from mlxpa.worker.outputs import EMPTY_STEP_RESULT, StepResult
from mlxpa.worker.paged_forward import (
    build_metadata,
    forward,
    layer_map,
    lm_head,
    paged_context,
)
from mlxpa.worker.penalties import PenaltyState
from mlxpa.worker.sampler import NOTHING_SAMPLED, Sampler
from mlxpa.worker.state_snapshots import StateCodec, restore_states, save_states
from mlxpa.worker.state_store import RecurrentStateStore

# A prefill chunk joins a group while its padding stays within this many tokens.
_MAX_PAD_TOKENS = 32
# The most bytes of blocks one read for the disk tier takes at once.
_SAVE_BATCH_BYTES = 64 * 2**20


def vocab_size(model, logits_width: int) -> int:
    """Token ids ``model`` takes and scores: the width of its logits (``logits_width``,
    from the probe), or the rows of its token embedding when that is smaller."""
    sizes = [logits_width]
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if embed is not None and hasattr(embed, "weight"):
        sizes.append(embed.weight.shape[0])
    return int(min(s for s in sizes if s is not None))


def token_slice(req: Request, start: int, end: int) -> list[int]:
    """``req.all_token_ids[start:end]`` without concatenating the whole context."""
    p, n = req.prompt_token_ids, len(req.prompt_token_ids)
    if start >= n:
        return req.output_token_ids[start - n:end - n]
    if end <= n:
        return p[start:end]
    return p[start:] + req.output_token_ids[:end - n]


def group_by_length(num_tokens: list[int], max_pad: int = _MAX_PAD_TOKENS,
                    verify: frozenset[int] = frozenset()) -> list[list[int]]:
    """Split the indices of the scheduled requests into groups run as one padded batch:
    decodes together, with the requests that verify drafts (``verify``: one forward streams
    the weights once for all of them), prefill chunks by similar length (sorted, longest
    first; a chunk joins a group while its padding stays within ``max_pad`` tokens; 0:
    equal lengths only, as recurrent-state models run)."""
    decode = [i for i, n in enumerate(num_tokens) if n == 1 or i in verify]
    prefill = sorted((i for i, n in enumerate(num_tokens) if n > 1 and i not in verify),
                     key=lambda i: -num_tokens[i])
    groups = [decode] if decode else []
    for i in prefill:
        if groups and groups[-1] is not decode and (
                num_tokens[groups[-1][0]] - num_tokens[i] <= max_pad):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


class ModelRunner:
    """Owns the model and the KV pools; executes scheduled steps.

    At construction the model is probed (:func:`mlxpa.worker.model_probe.probe_model`: per
    cache entry K/V heads, K and V widths, window, and the compute dtype, from mlx-lm's own
    caches) and checked (:func:`mlxpa.worker.load_check.verify_and_split`: two rows through
    the paged path against mlx-lm), once, so an unsupported model is refused before any row
    runs. The pool is built by :meth:`allocate_kv_cache`.

    Args:
        model: An mlx-lm model (floating weights already in the compute dtype; quantized
            layers of any mode ``nn.quantize`` supports).
        config: Engine configuration (block size, pool budget, seed).
        eos_token_ids: The model's EOS ids (masked for requests below ``min_tokens``).
        hf_tokenizer: The model's Hugging Face tokenizer, for the grammar matchers of
            constrained requests (None: requests cannot be constrained).

    Attributes:
        budget_blocks: Blocks the memory budget allows (:meth:`kv_blocks_for` of no need).
        kv_cache: The pools (:class:`PagedKVCache`), None before :meth:`allocate_kv_cache`.
        max_model_len: Model context in tokens (``max_position_embeddings`` or config).
        vocab_size: Columns of the logits (rows of the embedding): every token id fed to the
            model or used as a logits index is below it; the grammar bitmask's width.
        grammars: The matchers of constrained requests (:class:`Grammars`), or None.
        penalties: The ``logit_bias`` and penalty entries of the requests that set them
            (:class:`PenaltyState`).
        geometry: What the probe learned (:class:`ModelGeometry`).
        dtype: The compute dtype, which unquantized pools store.
        kv_storage: How each cache entry stores K/V (``config.kv_cache_dtype``;
            :class:`~mlxpa.worker.kv_storage.KVStorage`), and the KV cache groups.
        kv_cache_layout: The KV cache groups (:class:`~mlxpa.core.kv_cache_groups.
            KVCacheLayout`): what the KV cache manager pages.
        block_bytes: Bytes of one KV block over its layer slots, K and V, from the stored
            layout.
        states: The per-request recurrent-state store of a hybrid or state-space model
            (:class:`RecurrentStateStore`), or None.
        disk_store: The disk KV tier's files (set by the engine; None: no tier), where
            :meth:`save_kv` hands the bytes of the blocks a step saves.

    Raises:
        UnsupportedModelError: The model cannot run through the paged path (the reason is in
            the message).
    """

    def __init__(self, model, config: EngineConfig,
                 eos_token_ids: frozenset[int] = frozenset(), hf_tokenizer=None) -> None:
        self.model = model
        self.eos_token_ids = sorted(eos_token_ids)
        self.config = config
        self.block_size = config.block_size
        self.geometry = probe_model(model)
        self.dtype = self.geometry.dtype
        self.windows = self.geometry.windows
        self.kv_storage = kv_storage(self.geometry, config.kv_cache_dtype, config.kv_group_size,
                                     self.block_size)
        self.kv_cache_layout = self.kv_storage.layout
        self.layers = layer_map(self.geometry, self.kv_storage)
        self._split = verify_and_split(model, self.geometry, self.block_size,
                                       config.attention_backend, config.fused_cpu_ops,
                                       self.kv_storage)
        self.block_bytes = self.kv_storage.block_bytes(self.block_size)
        self.budget_blocks = self.kv_blocks_for(None)
        self.kv_cache: PagedKVCache | None = None
        args = getattr(model, "args", None)
        ctx = getattr(args, "max_position_embeddings", None) or 1 << 20
        self.max_model_len = min(ctx, config.max_model_len or ctx)
        self.vocab_size = vocab_size(model, self.geometry.logits_width)
        self.grammars = (Grammars(hf_tokenizer, self.vocab_size, self.eos_token_ids)
                         if hf_tokenizer is not None else None)
        self.penalties = PenaltyState()
        self.sampler = Sampler(self.eos_token_ids, self.grammars, self.penalties)
        self._head = lm_head(self._split)
        self._tables = BlockTableCopies(self.block_size)
        self.states = RecurrentStateStore.for_geometry(self.geometry)
        self._codec = StateCodec(self.geometry) if self.states is not None else None
        spec = config.speculative_config
        self.drafter = (Drafter(make_proposer(spec), spec.num_speculative_tokens, self.grammars)
                        if spec is not None and self.states is None else None)
        self.disk_store: DiskStore | None = None  # the disk tier's files (the engine's)

    def kv_blocks_for(self, kv_blocks_needed: int | None) -> int:
        """Blocks of the pool (null block included) for work that can use at most
        ``kv_blocks_needed`` (None: unknown): ``config.num_blocks`` when it fixes the pool,
        else :func:`~mlxpa.core.kv_sizing.num_kv_blocks` of the memory budget
        (:func:`~mlxpa.config.kv_budget_bytes`) and :attr:`block_bytes`."""
        if self.config.num_blocks is not None:
            return self.config.num_blocks
        return num_kv_blocks(kv_budget_bytes(self.config), self.block_bytes, kv_blocks_needed)

    def kv_segment_blocks(self, num_blocks: int) -> int:
        """Blocks of one segment of a growing pool of at most ``num_blocks`` blocks:
        ``config.kv_segment_bytes`` (None: :data:`~mlxpa.config.DEFAULT_KV_SEGMENT_BYTES`)
        over :attr:`block_bytes`, at least 2, at most ``num_blocks`` (0: ``num_blocks``, a
        pool that takes it all at once)."""
        size = self.config.kv_segment_bytes
        if size == 0:
            return num_blocks
        size = DEFAULT_KV_SEGMENT_BYTES if size is None else size
        return max(2, min(num_blocks, size // self.block_bytes))

    @staticmethod
    def thread_stream():
        """A context manager running MLX work on a new stream of the calling thread: MLX's
        streams belong to the thread that made them, so a thread other than the one that
        built the runner (``LLM``'s release thread) runs the runner's work on its own."""
        return mx.stream(mx.new_stream(mx.default_device()))

    @property
    def num_blocks(self) -> int:
        """Blocks the pools hold now, null block included (0 before
        :meth:`allocate_kv_cache`)."""
        return self.kv_cache.num_blocks if self.kv_cache is not None else 0

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """Build the KV pools with ``num_blocks`` blocks (null block included), in place of
        any pool before (vLLM's ``initialize_kv_cache``). The runner must hold no request's
        state: every request it ran was freed (``SchedulerOutput.finished``).

        Raises:
            ValueError: ``num_blocks`` below 2.
            RuntimeError: Requests still hold state in the runner.
        """
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (the null block and one more), got "
                             f"{num_blocks}")
        if self._tables:  # every request that ran a step has one, freed with the rest
            raise RuntimeError("allocate_kv_cache: requests still hold state in the runner")
        self.kv_cache = None  # the old pools go before the new ones take memory
        self.kv_cache = PagedKVCache(self.kv_storage.slot_specs, num_blocks, self.block_size,
                                     self.dtype, self.block_bytes)

    def prepare(self, on_wait: Callable[[int], None] | None = None) -> bool:
        """Make the first constrained step ready now: wait for the grammar tokenizer's build
        (:meth:`Grammars.prepare`; ``on_wait`` is called with the vocabulary size before
        waiting). Returns whether it had to wait."""
        return self.grammars is not None and self.grammars.prepare(on_wait)

    def _metadata(self, reqs: list[Request], counts: list[int],
                  cascade_groups: list[tuple[list[int], int]] | None = None,
                  drafts: dict[int, list[int]] | None = None) -> tuple[mx.array, object]:
        tokens = np.zeros((len(reqs), max(counts)), np.int32)
        starts = np.array([r.num_computed_tokens for r in reqs], np.int32)
        for row, (req, n) in enumerate(zip(reqs, counts)):
            d = drafts.get(req.key, []) if drafts else []
            tokens[row, :n] = token_slice(req, int(starts[row]), int(starts[row]) + n - len(d)
                                          ) + d
        per_row = [self._tables.get(r) for r in reqs]
        tables = [[t[g] for t in per_row] for g in range(len(self.layers.group_windows))]
        return build_metadata(tokens, counts, starts, tables, self.block_size,
                              self.layers.group_windows, self.config.attention_backend,
                              cascade_groups or ())

    def seed_for(self, req: Request) -> int:
        """The request's seed (sample 0) or one derived from it and the sample index, or,
        without a seed, one derived from the engine seed, the caller's ``request_id`` and the
        sample index (so a request's samples depend on its id, not on what else runs). The
        hash is CRC-32 of the key's ``repr`` (stable across processes, unlike Python's salted
        ``hash``)."""
        seed = req.sampling_params.seed
        if seed is not None and req.sample_index == 0:
            return seed
        key = (seed, req.sample_index) if seed is not None else (
            self.config.seed, req.request_id, req.sample_index)
        return zlib.crc32(repr(key).encode())

    def _free(self, finished: list[Request], preempted: list[Request]) -> None:
        """Forget the block-table copies of ``finished`` and ``preempted`` requests, the
        grammar matchers of finished ones (a preempted request keeps its matcher: its output
        tokens stay), the penalty entries of both (a preempted one's are rebuilt from its
        prompt and output tokens when it samples again) and the recurrent states of both (a
        preempted request recomputes from position 0)."""
        self._tables.drop([*finished, *preempted])
        self.penalties.drop([*finished, *preempted])
        if self.drafter is not None:
            self.drafter.finish(finished)
        if self.grammars is not None:
            for req in finished:
                self.grammars.release(req)
        if self.states is not None:
            self.states.drop([r.key for r in (*finished, *preempted)])

    def execute(self, out: SchedulerOutput) -> StepResult:
        """Run one scheduled step.

        Returns:
            The sampled tokens (one per request whose chunk reaches its last token and that
            samples, ``out.sampling``, in ``out.requests`` order), their log-probabilities
            where asked, the scored and target tokens' log-probabilities, and the grammar
            endings; :data:`EMPTY_STEP_RESULT` when no token is scheduled.
        """
        self._free(out.finished, out.preempted)
        size = self.num_blocks if out.num_kv_blocks is None else out.num_kv_blocks
        if size > self.num_blocks:
            self.kv_cache.resize(size)  # grown before the loads and copies, which may write there
        if out.kv_saves:  # first: the step may reuse the blocks they read
            self.save_kv(out.kv_saves)
        if out.kv_loads:
            self._load_kv(out.kv_loads)
        self.kv_cache.copy_blocks(out.blocks_to_copy)
        if size < self.num_blocks:
            self.kv_cache.resize(size)  # shrunk after them, which may read there
        if out.state_restores:
            restore_states(self.states, self.kv_cache, self._codec, out.state_restores)
        if not out.total_num_scheduled_tokens:
            return EMPTY_STEP_RESULT
        if self.kv_cache.raw_blocks:  # snapshot or disk bytes in blocks now written as K/V
            self.kv_cache.clear_raw(written_blocks(out.requests, out.num_scheduled_tokens,
                                                   self.kv_cache.block_size))
        reads = self._forward(out)
        save_states(self.states, self.kv_cache, self._codec, out.state_saves)
        scored = reads.take(ReadKind.SCORE)
        targets = self._targets(reads)
        # evaluated with the tokens: the written pools and states, the scored positions'
        # head inputs, the targets' log-probabilities
        pending = [*self._pools(), *([scored] if scored is not None else []),
                   *(targets.arrays if targets is not None else [])]
        order = list(dict.fromkeys(reads.owners[ReadKind.SAMPLE]))  # a request's rows: in a run
        reqs = [out.requests[i] for i in order]
        drafts = [out.spec_token_ids.get(r.key, []) for r in reqs]
        if reqs:  # one evaluation: tokens, pools and the reads
            res = self.sampler.sample([self._head(reads.take(ReadKind.SAMPLE))], reqs,
                                      [self.seed_for(r) for r in reqs], pending,
                                      drafts if any(drafts) else None)
        else:
            mx.eval(*pending)
            res = NOTHING_SAMPLED
        del pending
        by_row = dict(zip(order, res.tokens))
        return StepResult(
            sampled=[by_row[i] for i, s in enumerate(out.sampling) if s],
            logprobs={reqs[j].key: lp for j, lp in res.logprobs.items()},
            scored=self._scored(reads.owners[ReadKind.SCORE], scored),
            targets=_by_request(reads.owners[ReadKind.TARGET], targets),
            grammar_ended=res.grammar_ended, mask_time_s=res.mask_time_s,
            spec_token_ids=(self.drafter.propose(reqs, res.tokens)
                            if self.drafter is not None and out.propose_drafts else {}))

    def save_kv(self, saves: list[KVSave]) -> None:
        """Read the blocks of each disk save (:mod:`mlxpa.core.kv_disk`) now, a batch of at
        most :data:`_SAVE_BATCH_BYTES` at a time, and hand the bytes to the disk store,
        which writes the files on its thread."""
        if self.disk_store is None:
            return
        size = self.kv_cache.block_nbytes
        at = 0
        while at < len(saves):
            batch, blocks = [], 0
            while at < len(saves) and (not batch or (blocks + len(saves[at].blocks)) * size
                                       <= _SAVE_BATCH_BYTES):
                batch.append(saves[at])
                blocks += len(saves[at].blocks)
                at += 1
            data = self.kv_cache.read_bytes([b for s in batch for b in s.blocks])
            mx.eval(data)
            flat = memoryview(data)
            off = 0
            for s in batch:
                n = len(s.blocks) * size
                self.disk_store.put(s.header, bytes(flat[off:off + n]))
                off += n
            del data, flat

    def _load_kv(self, loads: list[KVLoad]) -> None:
        """Write the bytes read from disk into their fresh blocks, evaluated now (before the
        step's forward writes the pools, so those writes can take over their buffers)."""
        for load in loads:
            if load.blocks:
                self.kv_cache.write_bytes(load.blocks, mx.array(
                    np.frombuffer(load.payload, dtype=np.uint8)))
        mx.eval(self.kv_cache.arrays())

    def _targets(self, reads: StepReads) -> LogprobGather | None:
        """The log-probabilities of the target requests' ``target_token_ids`` at their last
        prompt token, each with its ``scored_top_logprobs`` alternatives (lazy)."""
        features = reads.take(ReadKind.TARGET)
        if features is None:
            return None
        pairs = [(k, t, r.scored_top_logprobs)
                 for k, r in enumerate(reads.owners[ReadKind.TARGET]) for t in r.target_token_ids]
        rows, ids, tops = (list(c) for c in zip(*pairs))
        return LogprobGather(self._head(features), rows, ids, tops)

    def _scored(self, scored: list[tuple[Request, int, int]],
                features: mx.array | None) -> dict[int, dict[int, TokenLogprob]]:
        """Per request key, position to the :class:`TokenLogprob` of its scored prompt token
        (``scored``: ``(request, position, token id)`` per read; ``features``: the head's
        inputs there, evaluated)."""
        if not scored:
            return {}
        values = scored_logprobs(features, self._head, self.geometry.logits_width,
                                 [t for _, _, t in scored],
                                 [r.scored_top_logprobs for r, _, _ in scored])
        by_request: dict[int, dict[int, TokenLogprob]] = {}
        for (req, position, _), value in zip(scored, values):
            by_request.setdefault(req.key, {})[position] = value
        return by_request

    def _forward(self, out: SchedulerOutput) -> StepReads:
        """Run the step's groups (lazily) and collect their reads (:class:`StepReads`)."""
        reads = StepReads()
        pad = _MAX_PAD_TOKENS if self.states is None else 0
        verify = frozenset(i for i, r in enumerate(out.requests) if r.key in out.spec_token_ids)
        groups = group_by_length(out.num_scheduled_tokens, pad, verify)
        with paged_context(self.model, self.config.fused_cpu_ops, self.geometry.has_kv):
            for g, group in enumerate(groups):
                reqs = [out.requests[i] for i in group]
                counts = [out.num_scheduled_tokens[i] for i in group]
                starts = [r.num_computed_tokens for r in reqs]
                plan, owners = self._plan(out, group, reqs, counts, starts)
                features = forward(self.model, self._split, self.kv_cache, self.layers, plan)
                if plan.states is not None:
                    self.states.save([r.key for r in reqs], starts, counts, plan.states)
                for kind, value in features.items():
                    reads.add(kind, owners[kind], value)
                if g + 1 < len(groups):
                    # The next group writes the pools. Its writes can take over a pool's
                    # buffer only if nothing else references it, but this group's lazy
                    # reads (attention gathers, up to its hidden states) still would: MLX
                    # would copy every whole pool once per further group. Evaluate this one.
                    mx.eval(*features.values(), *self._pools())
                del features
        return reads

    def _plan(self, out: SchedulerOutput, group: list[int], reqs: list[Request],
              counts: list[int], starts: list[int]) -> tuple[ForwardPlan, dict[ReadKind, list]]:
        """One group's :class:`ForwardPlan` (``group``: its indices in ``out.requests``), and
        per kind what each read position belongs to (:func:`group_reads`)."""
        tokens, meta = self._metadata(reqs, counts, _rows_of(out.cascade_groups, group),
                                      out.spec_token_ids)
        reads, owners = group_reads(group, reqs, counts, starts, out.sampling,
                                    out.spec_token_ids)
        states = (self.states.caches([r.key for r in reqs], starts, counts)
                  if self.states is not None else None)
        return ForwardPlan(tokens, meta, reads, states), owners

    def _pools(self) -> list[mx.array]:
        """Every array a forward pass writes in place: the K/V pools and recurrent states."""
        return [*self.kv_cache.arrays(),
                *(self.states.arrays() if self.states is not None else [])]


def _rows_of(groups: list, batch: list[int]) -> list[tuple[list[int], int]]:
    """The cascade groups (``SchedulerOutput.cascade_groups``) as rows of ``batch`` (indices
    into the step's requests): each group's members that run in ``batch``, where at least
    two do (prefill chunks of one group may fall into batches of different lengths)."""
    row = {i: k for k, i in enumerate(batch)}
    kept = (([row[i] for i in g.indices if i in row], g.num_blocks) for g in groups)
    return [(rows, n) for rows, n in kept if len(rows) > 1]


def _by_request(targets: list[Request],
                gather: LogprobGather | None) -> dict[int, list[TokenLogprob]]:
    """Per request key, the :class:`TokenLogprob` of each of its ``target_token_ids``."""
    values = iter(gather.values() if gather else ())
    return {req.key: [next(values) for _ in req.target_token_ids] for req in targets}
