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
from mlxpa.worker.attention import (
    AttentionMetadata,
    GroupTables,
    PagedLayerCache,
    WindowTables,
)
from mlxpa.worker.cascade import cascade_tables
from mlxpa.worker.forward_plan import ForwardPlan, ReadKind
from mlxpa.worker.kv_cache import PagedKVCache
from mlxpa.worker.kv_storage import KVStorage
from mlxpa.worker.model_probe import ModelGeometry
from mlxpa.worker.patches import fused_cpu_ops, paged_attention


@dataclass(frozen=True, slots=True)
class LayerMap:
    """Where each of mlx-lm's cache entries keeps its K/V.

    Attributes:
        slots: Per entry, ``(group, slot)``: the KV cache group whose tables it reads and the
            layer slot of the pool it writes; None for an entry without K/V (recurrent, or
            never written).
        windows: Per entry, its sliding window (None: full attention).
        gathered: Per entry, whether it attends over gathered K/V (latent attention).
        group_windows: Per group, the windows of its layers (None among them: full).
        layout: mlx-lm's cache list in entry indices (``ModelGeometry.layout``).
    """

    slots: tuple[tuple[int, int] | None, ...]
    windows: tuple[int | None, ...]
    gathered: tuple[bool, ...]
    group_windows: tuple[frozenset, ...]
    layout: list | None = None


def layer_map(geometry: ModelGeometry, storage: KVStorage) -> LayerMap:
    """The :class:`LayerMap` of a probed model stored as ``storage`` (its KV cache groups)."""
    where = storage.entry_slots()
    slots = tuple(where.get(e) for e in range(len(geometry.caches)))
    groups = len(storage.layout.groups) if storage.layout is not None else 0
    group_windows = tuple(frozenset(geometry.caches[e].window for e, s in enumerate(slots)
                                    if s is not None and s[0] == g) for g in range(groups))
    return LayerMap(slots, tuple(geometry.windows), tuple(geometry.gathered), group_windows,
                    geometry.layout)


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
            layers: LayerMap, plan: ForwardPlan) -> dict[ReadKind, mx.array]:
    """Run one padded group (inside :func:`paged_context`), lazily.

    Args:
        model: The mlx-lm model.
        split: Its body/head split (None: the model's output is read, logits).
        kv_cache: The K/V pools the group writes and attends over.
        layers: Where each cache entry keeps its K/V (windows, which attend over gathered
            K/V, the layout of mlx-lm's cache list).
        plan: The group's tokens, metadata, recurrent states and reads.

    Returns:
        Per kind with positions, the head's inputs there, ``[N, hidden]`` (``lm_head(split)``
        turns them into logits, so a caller can apply the head in slices), or, without a
        split, the ``[N, vocab]`` logits. The K/V writes are evaluated with the pools.
    """
    states = plan.states or {}
    leaves = [states[i] if i in states else _NoKV() if at is None else
              PagedLayerCache(kv_cache, at[1], plan.meta, w, g, at[0])
              for i, (at, w, g) in enumerate(zip(layers.slots, layers.windows,
                                                 layers.gathered))]
    layout = layers.layout
    caches = leaves if layout is None else [
        leaves[e] if isinstance(e, int) else _cache_list(leaves[j] for j in e) for e in layout]
    out = (model if split is None else split.body)(plan.tokens, cache=caches)
    return {kind: out[mx.array(p.rows), mx.array(p.cols)]
            for kind, p in plan.reads.items() if p.rows}


class _NoKV:
    """The cache of an entry the probe saw write nothing (its layer keeps no K/V)."""

    offset = 0

    def update_and_fetch(self, keys, values):
        raise RuntimeError("a layer the load probe saw write no K/V wrote K/V")

    def make_mask(self, *args, **kwargs) -> None:
        return None


def _cache_list(caches):
    from mlx_lm.models.cache import CacheList

    return CacheList(*caches)


def build_metadata(tokens: np.ndarray, counts: list[int], starts: np.ndarray,
                   block_tables: Sequence[Sequence[np.ndarray]], block_size: int,
                   group_windows: Sequence[frozenset], kernel: str,
                   cascade_groups: Sequence[tuple[Sequence[int], int]] = (),
                   ) -> tuple[mx.array, AttentionMetadata]:
    """Step inputs for ``B`` rows: per KV cache group the slot mapping, block tables,
    per-window trimmed tables (vLLM's slot mapping: ``block * block_size + offset``) and, for
    rows sharing leading blocks, each layer kind's cascade tables; the context lengths.

    Args:
        tokens: ``[B, L]`` int32 token ids, right-padded.
        counts: Scheduled tokens per row.
        starts: ``[B]`` int32 ``num_computed_tokens`` per row.
        block_tables: Per group, per row, int32 pool block ids covering the context after
            this step, perhaps more (``0`` where a sliding-window group no longer holds a
            block).
        block_size: Tokens per block.
        group_windows: Per group, the sliding windows of its layers (None: full attention).
        kernel: Paged-attention back end name.
        cascade_groups: Groups of rows sharing leading full blocks: their rows
            and the number of blocks (``SchedulerOutput.cascade_groups``, in this batch's
            rows); each layer kind keeps those its cost rule accepts
            (:func:`~mlxpa.worker.cascade.cascade_tables`).

    Returns:
        ``(tokens as mx.array, AttentionMetadata)``.
    """
    ctx = starts + np.array(counts, np.int32)
    nblocks = cdiv(ctx, block_size)
    groups = tuple(_group_tables(tables, counts, starts, nblocks, block_size, windows,
                                 cascade_groups, tokens.shape[1])
                   for tables, windows in zip(block_tables, group_windows))
    meta = AttentionMetadata(context_lens=mx.array(ctx), offsets=mx.array(starts),
                             groups=groups, kernel=kernel)
    return mx.array(tokens), meta


def _group_tables(block_tables: Sequence[np.ndarray], counts: list[int], starts: np.ndarray,
                  nblocks: np.ndarray, bs: int, windows: frozenset,
                  cascade_groups: Sequence[tuple[Sequence[int], int]],
                  width: int) -> GroupTables:
    """One group's :class:`GroupTables` (see :func:`build_metadata`)."""
    b = len(counts)
    slots = np.zeros((b, width), np.int64)
    tables = np.zeros((b, int(nblocks.max())), np.int32)
    for row, (bt, n) in enumerate(zip(block_tables, counts)):
        pos = np.arange(int(starts[row]), int(starts[row]) + n)
        slots[row, :n] = bt[pos // bs].astype(np.int64) * bs + pos % bs
        # A table may hold blocks past this step's context (allocated for drafts a later
        # step no longer verifies): no query reads them.
        held = min(len(bt), int(nblocks[row]))
        tables[row, :held] = bt[:held]
    window_tables = {}
    for w in {w for w in windows if w is not None}:
        first = np.maximum(starts - w + 1, 0) // bs
        wt = np.zeros((b, int((nblocks - first).max())), np.int32)
        for row in range(b):
            wt[row, :nblocks[row] - first[row]] = tables[row, first[row]:nblocks[row]]
        window_tables[w] = WindowTables(mx.array(wt), mx.array(first * bs))
    cascade = {}
    for w in windows if cascade_groups else ():
        layer_kind = cascade_tables(cascade_groups, starts, tables, nblocks, bs, w)
        if layer_kind is not None:
            cascade[w] = layer_kind
    slots = slots.reshape(-1)
    return GroupTables(slot_blocks=mx.array((slots // bs).astype(np.int32)),
                       slot_offsets=mx.array((slots % bs).astype(np.int32)),
                       block_tables=mx.array(tables), window_tables=window_tables,
                       cascade=cascade)
