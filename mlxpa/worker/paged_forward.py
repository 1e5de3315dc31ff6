"""One forward pass of an mlx-lm model over the paged KV cache, and the inputs it needs.

Shared by the model runner (every step) and the load check (the probe steps), so the check
runs exactly the code path the engine runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxpa.kernels.device import on_cpu
from mlxpa.utils import cdiv
from mlxpa.worker.attention import AttentionMetadata, PagedLayerCache, WindowTables
from mlxpa.worker.cascade import cascade_tables
from mlxpa.worker.forward_plan import ForwardPlan, ReadKind
from mlxpa.worker.kv_cache import PagedKVCache
from mlxpa.worker.model_probe import ModelGeometry
from mlxpa.worker.patches import fused_cpu_ops, paged_attention


@dataclass(frozen=True, slots=True)
class HeadSplit:
    """The model's body (token ids + caches → ``[B, L, hidden]``) and LM head
    (``[N, hidden]`` → ``[N, vocab]``), so the head runs only on rows that sample."""

    body: nn.Module
    head: Callable[[mx.array], mx.array]


def lm_head(split: HeadSplit | None) -> Callable[[mx.array], mx.array]:
    """What turns :func:`forward`'s output into logits: the split's LM head, or (no split:
    the model's output already is logits) the identity."""
    return split.head if split is not None else _identity


def _identity(x: mx.array) -> mx.array:
    return x


def find_head_split(model: nn.Module) -> HeadSplit | None:
    """A body/LM-head split candidate, found without assuming attribute names beyond
    mlx-lm's conventions: the text model (``language_model`` of a multimodal wrapper, else
    the model), its ``model`` body, and its ``lm_head`` or, with tied embeddings, the body's
    (possibly quantized) embedding as a linear layer. None when there is no candidate. The
    caller must verify the candidate against the full model (the load check does), since a
    model may scale or cap logits after its head."""
    text = model["language_model"] if "language_model" in model else model
    body = text["model"] if "model" in text else None
    if not isinstance(body, nn.Module):
        return None
    if "lm_head" in text and isinstance(text["lm_head"], nn.Module):
        return HeadSplit(body, text["lm_head"])
    embeddings = [m for m in body.children().values()
                  if isinstance(m, (nn.Embedding, nn.QuantizedEmbedding))]
    if len(embeddings) != 1:
        return None
    return HeadSplit(body, embeddings[0].as_linear)


@contextmanager
def paged_context(model: nn.Module, fused: bool, attention: bool = True) -> Iterator[None]:
    """Paged attention dispatch (and, on the CPU when ``fused``, the fused element-wise
    ops) for the model's modules while open; ``attention`` False for a model without K/V
    (a pure state-space model: nothing to dispatch)."""
    ops = fused_cpu_ops(model) if fused and on_cpu() else nullcontext()
    dispatch = paged_attention(model) if attention else nullcontext()
    with dispatch, ops:
        yield


def forward(model: nn.Module, split: HeadSplit | None, kv_cache: PagedKVCache,
            geometry: ModelGeometry, plan: ForwardPlan) -> dict[ReadKind, mx.array]:
    """Run one padded group (inside :func:`paged_context`), lazily.

    Args:
        model: The mlx-lm model.
        split: Its body/head split (None: the model's output is read, logits).
        kv_cache: The K/V pools the group writes and attends over.
        geometry: The model's cache entries (windows, which attend over gathered K/V, the
            layout of mlx-lm's cache list).
        plan: The group's tokens, metadata, recurrent states and reads.

    Returns:
        Per kind with positions, the head's inputs there, ``[N, hidden]`` (``lm_head(split)``
        turns them into logits, so a caller can apply the head in slices), or, without a
        split, the ``[N, vocab]`` logits. The K/V writes are evaluated with the pools.
    """
    states = plan.states or {}
    leaves = [states[i] if i in states else
              PagedLayerCache(kv_cache, i, plan.meta, w, g)
              for i, (w, g) in enumerate(zip(geometry.windows, geometry.gathered))]
    layout = geometry.layout
    caches = leaves if layout is None else [
        leaves[e] if isinstance(e, int) else _cache_list(leaves[j] for j in e) for e in layout]
    out = (model if split is None else split.body)(plan.tokens, cache=caches)
    return {kind: out[mx.array(p.rows), mx.array(p.cols)]
            for kind, p in plan.reads.items() if p.rows}


def _cache_list(caches):
    from mlx_lm.models.cache import CacheList

    return CacheList(*caches)


def build_metadata(tokens: np.ndarray, counts: list[int], starts: np.ndarray,
                   block_tables: list[np.ndarray], block_size: int,
                   windows: list[int | None], kernel: str,
                   cascade_groups: Sequence[tuple[Sequence[int], int]] = (),
                   ) -> tuple[mx.array, AttentionMetadata]:
    """Step inputs for ``B`` rows: slot mapping, block tables, context lengths,
    per-window trimmed tables (vLLM's slot mapping: ``block * block_size + offset``) and,
    for rows sharing leading blocks, each layer kind's cascade tables.

    Args:
        tokens: ``[B, L]`` int32 token ids, right-padded.
        counts: Scheduled tokens per row.
        starts: ``[B]`` int32 ``num_computed_tokens`` per row.
        block_tables: Per row, int32 pool block ids covering the context after this step.
        block_size: Tokens per block.
        windows: Per cache entry, its sliding window or None.
        kernel: Paged-attention back end name.
        cascade_groups: Groups of rows sharing leading full blocks: their rows
            and the number of blocks (``SchedulerOutput.cascade_groups``, in this batch's
            rows); each layer kind keeps those its cost rule accepts
            (:func:`~mlxpa.worker.cascade.cascade_tables`).

    Returns:
        ``(tokens as mx.array, AttentionMetadata)``.
    """
    bs, b, width = block_size, len(counts), tokens.shape[1]
    slots = np.zeros((b, width), np.int64)
    ctx = starts + np.array(counts, np.int32)
    nblocks = cdiv(ctx, bs)
    tables = np.zeros((b, int(nblocks.max())), np.int32)
    for row, (bt, n) in enumerate(zip(block_tables, counts)):
        pos = np.arange(int(starts[row]), int(starts[row]) + n)
        slots[row, :n] = bt[pos // bs].astype(np.int64) * bs + pos % bs
        tables[row, :len(bt)] = bt
    window_tables = {}
    for w in {w for w in windows if w is not None}:
        first = np.maximum(starts - w + 1, 0) // bs
        wt = np.zeros((b, int((nblocks - first).max())), np.int32)
        for row in range(b):
            wt[row, :nblocks[row] - first[row]] = tables[row, first[row]:nblocks[row]]
        window_tables[w] = WindowTables(mx.array(wt), mx.array(first * bs))
    cascade = {}
    for w in set(windows) if cascade_groups else ():
        layer_kind = cascade_tables(cascade_groups, starts, tables, nblocks, bs, w)
        if layer_kind is not None:
            cascade[w] = layer_kind
    slots = slots.reshape(-1)
    meta = AttentionMetadata(
        slot_blocks=mx.array((slots // bs).astype(np.int32)),
        slot_offsets=mx.array((slots % bs).astype(np.int32)),
        block_tables=mx.array(tables), context_lens=mx.array(ctx),
        offsets=mx.array(starts), window_tables=window_tables, kernel=kernel,
        cascade=cascade)
    return mx.array(tokens), meta
