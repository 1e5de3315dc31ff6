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
from contextlib import nullcontext
from typing import NamedTuple

import mlx.core as mx
import numpy as np

from mlxpa.blas import host_memory_bytes
from mlxpa.config import EngineConfig
from mlxpa.core.block_pool import cdiv
from mlxpa.core.scheduler import SchedulerOutput
from mlxpa.kernels.device import on_cpu
from mlxpa.loader.models import model_dtype
from mlxpa.request import Request, TokenLogprob
from mlxpa.worker.attention import AttentionMetadata, PagedLayerCache, WindowTables
from mlxpa.worker.kv_cache import PagedKVCache, block_bytes
from mlxpa.worker.logprobs import score_columns, target_logprobs
from mlxpa.worker.patches import fused_cpu_ops, paged_attention
from mlxpa.worker.sample_step import sample_step
from mlxpa.worker.structured import Grammars

# Body/head split is known for these (``model.model`` body, tied embedding or ``lm_head``).
_SPLIT_MODEL_TYPES = {"llama", "gemma3_text", "qwen2", "qwen3", "mistral"}
# A prefill chunk joins a group while its padding stays within this many tokens.
_MAX_PAD_TOKENS = 32


def default_kv_bytes() -> int:
    """KV pool budget when none is given: 15% of physical memory, at most 4 GiB."""
    total = host_memory_bytes() or 8 * 2**30
    return int(min(4 * 2**30, 0.15 * total))


def kv_shape(model) -> tuple[int, int, int]:
    """``(num_layers, kv_heads, head_dim)`` of an mlx-lm model."""
    args = model.args
    heads = args.num_attention_heads
    kv_heads = getattr(args, "num_key_value_heads", None) or heads
    head_dim = getattr(args, "head_dim", None) or args.hidden_size // heads
    return len(model.layers), kv_heads, head_dim


def sliding_windows(model) -> list[int | None]:
    """Per layer, the sliding window in tokens (from ``model.make_cache()``) or None."""
    from mlx_lm.models.cache import RotatingKVCache

    if not hasattr(model, "make_cache"):
        return [None] * len(model.layers)
    return [c.max_size if isinstance(c, RotatingKVCache) else None for c in model.make_cache()]


def token_slice(req: Request, start: int, end: int) -> list[int]:
    """``req.all_token_ids[start:end]`` without concatenating the whole context."""
    p, n = req.prompt_token_ids, len(req.prompt_token_ids)
    if start >= n:
        return req.output_token_ids[start - n:end - n]
    if end <= n:
        return p[start:end]
    return p[start:] + req.output_token_ids[:end - n]


def group_by_length(num_tokens: list[int]) -> list[list[int]]:
    """Split the indices of the scheduled requests into groups run as one padded batch:
    decodes together, prefill chunks by similar length (sorted, longest first; a chunk joins
    a group while its padding stays within ``_MAX_PAD_TOKENS``)."""
    decode = [i for i, n in enumerate(num_tokens) if n == 1]
    prefill = sorted((i for i, n in enumerate(num_tokens) if n > 1), key=lambda i: -num_tokens[i])
    groups = [decode] if decode else []
    for i in prefill:
        if groups and groups[-1] is not decode and (
                num_tokens[groups[-1][0]] - num_tokens[i] <= _MAX_PAD_TOKENS):
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

    Args:
        model: An mlx-lm model (weights already in the compute dtype).
        config: Engine configuration (block size, pool budget, seed).
        eos_token_ids: The model's EOS ids (masked for requests below ``min_tokens``).
        grammars: Matchers of constrained rows (None: rows cannot be constrained).

    Attributes:
        num_blocks: Blocks per pool, null block included.
        max_model_len: Model context in tokens (``max_position_embeddings`` or config).
    """

    def __init__(self, model, config: EngineConfig,
                 eos_token_ids: frozenset[int] = frozenset(),
                 grammars: Grammars | None = None) -> None:
        self.model = model
        self.grammars = grammars
        self.eos_token_ids = sorted(eos_token_ids)
        self.config = config
        self.block_size = config.block_size
        num_layers, kv_heads, head_dim = kv_shape(model)
        self.dtype = model_dtype(model)
        self.block_bytes = block_bytes(num_layers, self.block_size, kv_heads, head_dim,
                                       self.dtype)
        budget = (config.kv_memory_gib * 2**30 if config.kv_memory_gib is not None
                  else default_kv_bytes())
        self.num_blocks = config.num_blocks or max(2, int(budget) // self.block_bytes + 1)
        self.kv_cache = PagedKVCache(num_layers, self.num_blocks, self.block_size, kv_heads,
                                     head_dim, self.dtype)
        self.windows = sliding_windows(model)
        ctx = getattr(model.args, "max_position_embeddings", None) or 1 << 20
        self.max_model_len = min(ctx, config.max_model_len or ctx)
        self._split = getattr(model, "model_type", None) in _SPLIT_MODEL_TYPES
        self._tables: dict[Request, tuple[np.ndarray, int, int]] = {}

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

    def _metadata(self, reqs: list[Request], counts: list[int]) -> tuple[mx.array,
                                                                          AttentionMetadata]:
        bs, b, width = self.block_size, len(reqs), max(counts)
        tokens = np.zeros((b, width), np.int32)
        slots = np.zeros((b, width), np.int64)
        starts = np.array([r.num_computed_tokens for r in reqs], np.int32)
        ctx = starts + np.array(counts, np.int32)
        nblocks = cdiv(ctx, bs)
        tables = np.zeros((b, int(nblocks.max())), np.int32)
        for i, (req, n) in enumerate(zip(reqs, counts)):
            s = int(starts[i])
            tokens[i, :n] = token_slice(req, s, s + n)
            bt = self._block_table(req)
            pos = np.arange(s, s + n)
            slots[i, :n] = bt[pos // bs].astype(np.int64) * bs + pos % bs
            tables[i, :len(bt)] = bt
        window_tables = {}
        for w in {w for w in self.windows if w is not None}:
            first = np.maximum(starts - w + 1, 0) // bs
            wt = np.zeros((b, int((nblocks - first).max())), np.int32)
            for i in range(b):
                wt[i, :nblocks[i] - first[i]] = tables[i, first[i]:nblocks[i]]
            window_tables[w] = WindowTables(mx.array(wt), mx.array(first * bs))
        slots = slots.reshape(-1)
        meta = AttentionMetadata(
            slot_blocks=mx.array((slots // bs).astype(np.int32)),
            slot_offsets=mx.array((slots % bs).astype(np.int32)),
            block_tables=mx.array(tables), context_lens=mx.array(ctx),
            offsets=mx.array(starts), window_tables=window_tables,
            kernel=self.config.kernel)
        return mx.array(tokens), meta

    def _forward(self, tokens: mx.array, meta: AttentionMetadata, sampled: list[int],
                 cols: list[int]) -> mx.array | None:
        """Run one padded group; return ``[len(sampled), vocab]`` logits at ``(sampled, cols)``
        (None when no request samples: only the K/V writes matter, evaluated with the pools)."""
        caches = [PagedLayerCache(self.kv_cache, i, meta, w) for i, w in enumerate(self.windows)]
        if not self._split:
            out = self.model(tokens, cache=caches)
            return out[mx.array(sampled), mx.array(cols)] if sampled else None
        hidden = self.model.model(tokens, cache=caches)
        if not sampled:
            return None
        hidden = hidden[mx.array(sampled), mx.array(cols)]
        if "lm_head" in self.model:
            return self.model.lm_head(hidden)
        return self.model.model.embed_tokens.as_linear(hidden)

    def seed_for(self, req: Request) -> int:
        """The request's seed (sample 0) or one derived from it and the sample index, or,
        without a seed, one derived from the engine seed and the request id."""
        seed = req.sampling_params.seed
        if seed is not None and req.sample_index == 0:
            return seed
        key = (seed, req.sample_index) if seed is not None else (
            self.config.seed, req.request_id, req.sample_index)
        return zlib.crc32(repr(key).encode())

    def execute(self, out: SchedulerOutput) -> StepResult:
        """Run one scheduled step.

        Returns:
            The sampled tokens (one per request whose chunk reaches its last token,
            ``out.sampling``, in ``out.requests`` order), their log-probabilities where asked,
            and the scored tokens of scoring requests.
        """
        for req in [r for r in self._tables if r.is_finished]:
            del self._tables[req]
            if self.grammars is not None:
                self.grammars.release(req)
        self.kv_cache.copy_blocks(out.blocks_to_copy)
        sampling = out.sampling
        order, logits, scored, score_logits = [], [], [], []
        fused = (fused_cpu_ops(self.model) if self.config.fused_cpu_ops and on_cpu()
                 else nullcontext())
        with paged_attention(self.model), fused:
            for group in group_by_length(out.num_scheduled_tokens):
                reqs = [out.requests[i] for i in group]
                counts = [out.num_scheduled_tokens[i] for i in group]
                tokens, meta = self._metadata(reqs, counts)
                rows = [k for k, i in enumerate(group) if sampling[i]]
                extra = [(k, *c) for k, r in enumerate(reqs)
                         for c in score_columns(r, r.num_computed_tokens, counts[k])]
                result = self._forward(tokens, meta, rows + [e[0] for e in extra],
                                       [counts[k] - 1 for k in rows] + [e[1] for e in extra])
                if rows:
                    order.extend(group[k] for k in rows)
                    logits.append(result[:len(rows)])
                if extra:
                    score_logits.append(result[len(rows):])
                    scored.extend((reqs[k], p) for k, _, _, p in extra)
        pools = [*self.kv_cache.key_caches, *self.kv_cache.value_caches]
        scores = []
        if scored:
            values = target_logprobs(mx.concatenate(score_logits),
                                     [r.prompt_token_ids[p] for r, p in scored])
            scores = [(r, p, v) for (r, p), v in zip(scored, values)]
        if not order:
            mx.eval(*pools)
            return StepResult([], {}, scores, {})
        reqs = [out.requests[i] for i in order]
        res = sample_step(mx.concatenate(logits), reqs, [self.seed_for(r) for r in reqs],
                          self.eos_token_ids, self.grammars, pools)
        by_row = dict(zip(order, res.tokens))
        return StepResult([by_row[i] for i in range(len(out.requests)) if sampling[i]],
                          {reqs[j]: lp for j, lp in res.logprobs.items()}, scores,
                          {reqs[j]: v for j, v in res.first_scores.items()})
