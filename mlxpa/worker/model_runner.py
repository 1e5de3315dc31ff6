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

import mlx.core as mx
import numpy as np

from mlxpa.blas import host_memory_bytes
from mlxpa.config import EngineConfig
from mlxpa.core.scheduler import SchedulerOutput
from mlxpa.request import Request
from mlxpa.worker.kv_cache import PagedKVCache, block_bytes
from mlxpa.worker.load_check import check_paged_path
from mlxpa.worker.model_probe import probe_model
from mlxpa.worker.paged_forward import build_metadata, forward, paged_context
from mlxpa.worker.sampling import sample

# A prefill chunk joins a group while its padding stays within this many tokens.
_MAX_PAD_TOKENS = 32


def default_kv_bytes() -> int:
    """KV pool budget when none is given: 15% of physical memory, at most 4 GiB."""
    total = host_memory_bytes() or 8 * 2**30
    return int(min(4 * 2**30, 0.15 * total))


def vocab_size(model) -> int:
    """Token ids ``model`` takes and scores: ``args.vocab_size``, or the rows of its token
    embedding when that is smaller (or the model has no ``args.vocab_size``)."""
    sizes = [getattr(getattr(model, "args", None), "vocab_size", None)]
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

    Attributes:
        num_blocks: Blocks per pool, null block included.
        max_model_len: Model context in tokens (``max_position_embeddings`` or config).
        vocab_size: Columns of the logits (rows of the embedding): every token id fed to the
            model or used as a logits index is below it.
        geometry: What the probe learned (:class:`ModelGeometry`).
        dtype: The compute dtype, which the pools store.

    Raises:
        UnsupportedModelError: The model cannot run through the paged path (the reason is in
            the message).
    """

    def __init__(self, model, config: EngineConfig,
                 eos_token_ids: frozenset[int] = frozenset()) -> None:
        self.model = model
        self.eos_token_ids = sorted(eos_token_ids)
        self.config = config
        self.block_size = config.block_size
        self.geometry = probe_model(model)
        self.dtype = self.geometry.dtype
        self.windows = self.geometry.windows
        self._split = check_paged_path(model, self.geometry, self.block_size, config.kernel,
                                       config.fused_cpu_ops)
        shapes = [c.shape for c in self.geometry.caches]
        self.block_bytes = max(1, block_bytes(shapes, self.block_size, self.dtype))
        budget = (config.kv_memory_gib * 2**30 if config.kv_memory_gib is not None
                  else default_kv_bytes())
        self.num_blocks = config.num_blocks or max(2, int(budget) // self.block_bytes + 1)
        self.kv_cache = PagedKVCache(shapes, self.num_blocks, self.block_size, self.dtype)
        args = getattr(model, "args", None)
        ctx = getattr(args, "max_position_embeddings", None) or 1 << 20
        self.max_model_len = min(ctx, config.max_model_len or ctx)
        self.vocab_size = vocab_size(model)
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
        without a seed, one derived from the engine seed and the request id."""
        seed = req.sampling_params.seed
        if seed is not None and req.sample_index == 0:
            return seed
        key = (seed, req.sample_index) if seed is not None else (
            self.config.seed, req.request_id, req.sample_index)
        return zlib.crc32(repr(key).encode())

    def _mask_early_stops(self, logits: mx.array, reqs: list[Request]) -> mx.array:
        """EOS and stop token ids get -inf logits for requests that have not yet generated
        ``min_tokens`` tokens (vLLM's ``min_tokens`` rule). A request whose banned ids would
        cover the whole vocabulary is left as it is (there would be nothing to sample).

        Raises:
            IndexError: A banned id is not a column of ``logits`` (the engine refuses such
                requests; a scatter out of range would write another request's row or crash).
        """
        masked, cols = [], []
        for i, r in enumerate(reqs):
            sp = r.sampling_params
            if r.num_output_tokens < sp.min_tokens:
                banned = sorted(set(sp.stop_token_ids) | set(self.eos_token_ids))
                if banned and not 0 <= banned[0] <= banned[-1] < logits.shape[-1]:
                    raise IndexError(f"token ids {banned} outside the logits' "
                                     f"{logits.shape[-1]} columns")
                if len(banned) < logits.shape[-1]:
                    masked.extend([i] * len(banned))
                    cols.extend(banned)
        if masked:
            logits[mx.array(masked), mx.array(cols)] = -float("inf")
        return logits

    def execute(self, out: SchedulerOutput) -> list[int]:
        """Run one scheduled step.

        Returns:
            One sampled token id per request whose chunk reaches its last token
            (``out.sampling``), in ``out.requests`` order.
        """
        for req in [r for r in self._tables if r.is_finished]:
            del self._tables[req]
        self.kv_cache.copy_blocks(out.blocks_to_copy)
        sampling = out.sampling
        order, logits = [], []
        with paged_context(self.model, self.config.fused_cpu_ops):
            for group in group_by_length(out.num_scheduled_tokens):
                reqs = [out.requests[i] for i in group]
                counts = [out.num_scheduled_tokens[i] for i in group]
                tokens, meta = self._metadata(reqs, counts)
                sampled = [k for k, i in enumerate(group) if sampling[i]]
                result = forward(self.model, self._split, self.kv_cache, self.windows, tokens,
                                 meta, sampled, [counts[k] - 1 for k in sampled])
                if result is not None:
                    order.extend(group[k] for k in sampled)
                    logits.append(result)
        pools = (self.kv_cache.key_caches, self.kv_cache.value_caches)
        if not order:
            mx.eval(*pools)
            return []
        reqs = [out.requests[i] for i in order]
        logits = self._mask_early_stops(mx.concatenate(logits), reqs)
        toks = sample(logits, [r.sampling_params for r in reqs],
                      [self.seed_for(r) for r in reqs], [r.num_output_tokens for r in reqs])
        mx.eval(toks, *pools)
        by_index = dict(zip(order, toks.tolist()))
        return [by_index[i] for i in range(len(out.requests)) if sampling[i]]
