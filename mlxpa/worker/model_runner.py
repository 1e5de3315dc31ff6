"""Model runner: KV pool sizing, step inputs, one forward pass per group of requests, sampling.

The runner reads a :class:`SchedulerOutput` and returns sampled token ids; it never mutates
requests, blocks or the scheduler. Per step it:

1. applies copy-on-write block copies;
2. splits the scheduled requests into a decode group (one token each) and prefill groups of
   similar chunk length (requests of one group are right-padded to the group's longest chunk;
   padding a decode to a prefill chunk would cost the chunk's FLOPs);
3. builds per-group metadata with numpy (slot mapping, block tables, context lengths,
   positions, sliding-window tables) and converts it once;
4. runs the model body with one :class:`PagedLayerCache` per layer, slices the hidden state
   of each request's last token and applies the LM head only to requests that sample (Gemma 3's head
   over 262,144 tokens costs more than the rest of the 270M model);
5. samples and evaluates everything (tokens and every written pool) in one ``mx.eval``.
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

import mlx.core as mx
import numpy as np

from mlxpa.blas import host_memory_bytes
from mlxpa.config import EngineConfig
from mlxpa.core.scheduler import SchedulerOutput
from mlxpa.request import Request, TokenLogprob
from mlxpa.worker.kv_cache import PagedKVCache
from mlxpa.worker.kv_storage import kv_storage
from mlxpa.worker.load_check import check_paged_path
from mlxpa.worker.logprobs import score_columns, target_logprobs
from mlxpa.worker.model_probe import probe_model
from mlxpa.worker.paged_forward import build_metadata, forward, paged_context
from mlxpa.worker.sample_step import sample_step
from mlxpa.worker.state_store import RecurrentStateStore
from mlxpa.worker.structured import Grammars

# A prefill chunk joins a group while its padding stays within this many tokens.
_MAX_PAD_TOKENS = 32


def default_kv_bytes() -> int:
    """KV pool budget when none is given: 15% of physical memory, at most 4 GiB."""
    total = host_memory_bytes() or 8 * 2**30
    return int(min(4 * 2**30, 0.15 * total))


def kv_budget_blocks(one_block_bytes: int, config: EngineConfig) -> int:
    """Blocks (null block included) the memory budget allows: ``config.num_blocks``, else
    ``--kv-memory`` (or :func:`default_kv_bytes`) over ``one_block_bytes`` (all layers, K
    and V)."""
    if config.num_blocks:
        return config.num_blocks
    budget = (config.kv_memory_gib * 2**30 if config.kv_memory_gib is not None
              else default_kv_bytes())
    return max(2, int(budget) // one_block_bytes + 1)


def model_block_bytes(model, block_size: int, kv_cache_dtype: str = "auto",
                      kv_group_size: int = 64) -> int:
    """Bytes one KV block of ``model`` takes (all layers, K and V) stored as
    ``kv_cache_dtype``, from a probe forward."""
    return kv_storage(probe_model(model), kv_cache_dtype, kv_group_size).block_bytes(block_size)


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


def group_by_length(num_tokens: list[int], max_pad: int = _MAX_PAD_TOKENS) -> list[list[int]]:
    """Split the indices of the scheduled requests into groups run as one padded batch:
    decodes together, prefill chunks by similar length (sorted, longest first; a chunk joins
    a group while its padding stays within ``max_pad`` tokens; 0: equal lengths only, as
    recurrent-state models run)."""
    decode = [i for i, n in enumerate(num_tokens) if n == 1]
    prefill = sorted((i for i, n in enumerate(num_tokens) if n > 1), key=lambda i: -num_tokens[i])
    groups = [decode] if decode else []
    for i in prefill:
        if groups and groups[-1] is not decode and (
                num_tokens[groups[-1][0]] - num_tokens[i] <= max_pad):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


class StepResult(NamedTuple):
    """What one step produced.

    Attributes:
        sampled: One token id per request whose chunk reached its last token, in order.
        logprobs: Per request that asks, the sampled token's :class:`TokenLogprob`.
        scores: ``(scoring request, position, log-probability)`` of each scored token.
        first_scores: Per choice row sampling its first token, the log-probability of each
            choice's first token.
    """

    sampled: list[int]
    logprobs: dict[Request, TokenLogprob]
    scores: list[tuple[Request, int, float]]
    first_scores: dict[Request, list[float]]


class ModelRunner:
    """Owns the model and the KV pools; executes scheduled steps.

    At construction the model is probed (:func:`mlxpa.worker.model_probe.probe_model`: per
    cache entry K/V heads, K and V widths, window, and the compute dtype, from mlx-lm's own
    caches) and checked (:func:`mlxpa.worker.load_check.check_paged_path`: two rows through
    the paged path against mlx-lm), so an unsupported model is refused before any row runs.

    Args:
        model: An mlx-lm model (floating weights already in the compute dtype; quantized
            layers of any mode ``nn.quantize`` supports).
        config: Engine configuration (block size, pool budget, seed).
        eos_token_ids: The model's EOS ids (masked for requests below ``min_tokens``).
        grammars: Matchers of constrained rows (None: rows cannot be constrained).

    Attributes:
        num_blocks: Blocks per pool, null block included:
            ``min(budget_blocks, config.kv_blocks_needed)``.
        budget_blocks: Blocks the memory budget allows (:func:`kv_budget_blocks`).
        max_model_len: Model context in tokens (``max_position_embeddings`` or config).
        vocab_size: Columns of the logits (rows of the embedding): every token id fed to the
            model or used as a logits index is below it.
        geometry: What the probe learned (:class:`ModelGeometry`).
        dtype: The compute dtype, which unquantized pools store.
        kv_storage: How each cache entry stores K/V (``config.kv_cache_dtype``;
            :class:`~mlxpa.worker.kv_storage.KVStorage`).
        block_bytes: Bytes of one block over all pools, from the stored layout.
        states: The per-request recurrent-state store of a hybrid or state-space model
            (:class:`RecurrentStateStore`), or None.

    Raises:
        UnsupportedModelError: The model cannot run through the paged path (the reason is in
            the message).
    """

    def __init__(self, model, config: EngineConfig,
                 eos_token_ids: frozenset[int] = frozenset(),
                 grammars: Grammars | None = None) -> None:
        self.model = model
        self.grammars = grammars
        self.eos_token_ids = sorted(eos_token_ids)
        self.config = config
        self.block_size = config.block_size
        self.geometry = probe_model(model)
        self.dtype = self.geometry.dtype
        self.windows = self.geometry.windows
        self.kv_storage = kv_storage(self.geometry, config.kv_cache_dtype, config.kv_group_size)
        self._split = check_paged_path(model, self.geometry, self.block_size, config.kernel,
                                       config.fused_cpu_ops, self.kv_storage)
        self.block_bytes = self.kv_storage.block_bytes(self.block_size)
        self.budget_blocks = kv_budget_blocks(self.block_bytes, config)
        self.num_blocks = max(2, min(self.budget_blocks,
                                     config.kv_blocks_needed or self.budget_blocks))
        self.kv_cache = PagedKVCache(self.kv_storage.specs, self.num_blocks, self.block_size,
                                     self.dtype)
        args = getattr(model, "args", None)
        ctx = getattr(args, "max_position_embeddings", None) or 1 << 20
        self.max_model_len = min(ctx, config.max_model_len or ctx)
        self.vocab_size = vocab_size(model, self.geometry.logits_width)
        self._tables: dict[Request, tuple[np.ndarray, int, int]] = {}
        self.states = RecurrentStateStore.for_geometry(self.geometry)

    def _block_table(self, req: Request) -> np.ndarray:
        """Runner-side numpy copy of ``req.block_table``, synced incrementally: full blocks
        before ``num_computed_tokens`` never change while the request holds them, so only
        the tail is re-read (everything after a preemption)."""
        arr, synced, npre = self._tables.get(req, (None, 0, -1))
        table = req.block_table
        if arr is None or npre != req.num_preemptions or len(table) > len(arr):
            new = np.zeros(max(16, 2 * len(table)), np.int32)
            if arr is not None and npre == req.num_preemptions:
                new[:synced] = arr[:synced]
            else:
                synced = 0
            arr = new
        start = min(synced, req.num_computed_tokens // self.block_size)
        arr[start:len(table)] = table[start:]
        self._tables[req] = (arr, len(table), req.num_preemptions)
        return arr[:len(table)]

    def _metadata(self, reqs: list[Request], counts: list[int]) -> tuple[mx.array, object]:
        tokens = np.zeros((len(reqs), max(counts)), np.int32)
        starts = np.array([r.num_computed_tokens for r in reqs], np.int32)
        for row, (req, n) in enumerate(zip(reqs, counts)):
            tokens[row, :n] = token_slice(req, int(starts[row]), int(starts[row]) + n)
        tables = [self._block_table(r) for r in reqs]
        return build_metadata(tokens, counts, starts, tables, self.block_size, self.windows,
                              self.config.kernel)

    def seed_for(self, req: Request) -> int:
        """The request's seed (sample 0) or one derived from it and the sample index, or,
        without a seed, one derived from the engine seed, the request's ``seed_key`` (the
        row's id; ``request_id`` when None) and the sample index. The hash is CRC-32 of the
        key's ``repr`` (stable across processes, unlike Python's salted ``hash``)."""
        seed = req.sampling_params.seed
        if seed is not None and req.sample_index == 0:
            return seed
        ident = req.request_id if req.seed_key is None else req.seed_key
        key = (seed, req.sample_index) if seed is not None else (
            self.config.seed, ident, req.sample_index)
        return zlib.crc32(repr(key).encode())

    def release_finished(self, preempted: list[Request] = ()) -> None:
        """Forget the block-table copies, grammar matchers and recurrent states of finished
        requests, and the states of ``preempted`` ones (recomputed from position 0 when they
        run again)."""
        for req in [r for r in self._tables if r.is_finished]:
            del self._tables[req]
            if self.grammars is not None:
                self.grammars.release(req)
        if self.states is not None:
            self.states.drop([r for r in self.states.keys() if r.is_finished] + list(preempted))

    def execute(self, out: SchedulerOutput) -> StepResult:
        """Run one scheduled step.

        Returns:
            The sampled tokens (one per request whose chunk reaches its last token,
            ``out.sampling``, in ``out.requests`` order), their log-probabilities where asked,
            and the scored tokens of scoring requests.
        """
        self.release_finished(out.preempted)
        self.kv_cache.copy_blocks(out.blocks_to_copy)
        sampling = out.sampling
        order, logits, scored, score_logits = [], [], [], []
        with paged_context(self.model, self.config.fused_cpu_ops, self.geometry.has_kv):
            pad = _MAX_PAD_TOKENS if self.states is None else 0
            for group in group_by_length(out.num_scheduled_tokens, pad):
                reqs = [out.requests[i] for i in group]
                counts = [out.num_scheduled_tokens[i] for i in group]
                tokens, meta = self._metadata(reqs, counts)
                rows = [k for k, i in enumerate(group) if sampling[i]]
                extra = [(k, *c) for k, r in enumerate(reqs)
                         for c in score_columns(r, r.num_computed_tokens, counts[k])]
                starts = [r.num_computed_tokens for r in reqs]
                states = (self.states.caches(reqs, starts, counts)
                          if self.states is not None else None)
                result = forward(self.model, self._split, self.kv_cache, self.windows, tokens,
                                 meta, rows + [e[0] for e in extra],
                                 [counts[k] - 1 for k in rows] + [e[1] for e in extra],
                                 self.geometry.gathered, states, self.geometry.layout)
                if self.states is not None:
                    self.states.save(reqs, starts, counts, states)
                if rows:
                    order.extend(group[k] for k in rows)
                    logits.append(result[:len(rows)] if extra else result)
                if extra:
                    score_logits.append(result[len(rows):])
                    scored.extend((reqs[k], p) for k, _, _, p in extra)
                del result  # sample_step alone holds the logits (the mask may reuse them)
        pools = [*self.kv_cache.key_caches, *self.kv_cache.value_caches,
                 *(self.states.arrays() if self.states is not None else [])]
        scores = []
        if scored:
            values = target_logprobs(mx.concatenate(score_logits),
                                     [r.prompt_token_ids[p] for r, p in scored])
            scores = [(r, p, v) for (r, p), v in zip(scored, values)]
        if not order:
            mx.eval(*pools)
            return StepResult([], {}, scores, {})
        reqs = [out.requests[i] for i in order]
        res = sample_step(logits, reqs, [self.seed_for(r) for r in reqs],
                          self.eos_token_ids, self.grammars, pools)
        by_row = dict(zip(order, res.tokens))
        return StepResult([by_row[i] for i in range(len(out.requests)) if sampling[i]],
                          {reqs[j]: lp for j, lp in res.logprobs.items()}, scores,
                          {reqs[j]: v for j, v in res.first_scores.items()})
