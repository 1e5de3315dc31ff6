"""Paged attention inside unmodified mlx-lm models, through mlx-lm's own cache protocol.

mlx-lm attention modules read ``cache.offset`` (RoPE), call ``cache.update_and_fetch(k, v)``
and then ``scaled_dot_product_attention(q, k, v, cache=cache, ...)``, a name bound in the
model's own module. mlxpa passes one :class:`PagedLayerCache` per layer: ``offset`` is an
``mx.array`` of per-request positions, ``update_and_fetch`` writes the new K/V into the pool at
the slot mapping, ``make_mask`` returns None (the paged path builds its own masks), and
:func:`mlxpa.worker.patches.paged_attention` swaps the module's
``scaled_dot_product_attention`` for a dispatcher that routes paged caches to
:func:`mlxpa.kernels.paged_attention`. Projections, norms and RoPE stay mlx-lm's, so no
per-model code is needed (the vllm-metal design, without its per-model branches).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx

from mlxpa.kernels import PagedKV, cascade_attention, paged_attention
from mlxpa.kernels.quant import dense
from mlxpa.kernels.reference import gather_kv, gathered_attention
from mlxpa.worker.cascade import CascadeTables
from mlxpa.worker.kv_cache import PagedKVCache


@dataclass(frozen=True, slots=True)
class WindowTables:
    """Block tables trimmed to a sliding window: only blocks a query can still see."""

    block_tables: mx.array  # [B, max_window_blocks] int32
    key_start: mx.array     # [B] int32 position of each request's first gathered key


@dataclass(frozen=True, slots=True)
class GroupTables:
    """One KV cache group's per-step tables (its layers' slot mapping and block tables).

    Attributes:
        slot_blocks: ``[B * L]`` int32 block id of each scheduled token (padding: 0).
        slot_offsets: ``[B * L]`` int32 offset of each token inside its block.
        block_tables: ``[B, max_blocks]`` int32 block ids per request (``0`` where a
            sliding-window group no longer holds a block).
        window_tables: Per sliding-window size of the group's layers, tables trimmed to
            that window.
        cascade: Per layer kind (its sliding window, None for full attention), the groups of
            the batch that attend over their shared prefix once and the tables of each
            row's own keys (:class:`~mlxpa.worker.cascade.CascadeTables`); a kind without an
            entry attends as usual.
    """

    slot_blocks: mx.array
    slot_offsets: mx.array
    block_tables: mx.array
    window_tables: dict[int, WindowTables]
    cascade: dict[int | None, CascadeTables] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    """Frozen per-step inputs shared by every layer.

    Attributes:
        context_lens: ``[B]`` int32 tokens with K/V after this step's write.
        offsets: ``[B]`` int32 position of each request's first scheduled token (its
            ``num_computed_tokens``; mlx-lm's per-row cache ``offset``). Not vLLM's
            ``query_start_loc``, which is cumulative over the flattened batch; the kernels
            take it as their ``query_start`` argument (the name in the pinned Metal sources).
        groups: Per KV cache group, its tables (:class:`GroupTables`).
        kernel: Paged-attention backend (``auto``, ``reference``, ``cpu``, ``metal``, ``cuda``).
    """

    context_lens: mx.array
    offsets: mx.array
    groups: tuple[GroupTables, ...]
    kernel: str = "auto"


class PagedLayerCache:
    """One layer's view of the paged KV cache for one step (mlx-lm cache protocol).

    Args:
        kv_cache: The pools.
        layer_idx: Which layer slot's pools.
        metadata: This step's metadata.
        sliding_window: The layer's window in tokens, or None for full attention.
        gathered: The layer attends over K/V it derives from what it cached (latent
            attention, MLA; K/V heads repeated in the model): ``update_and_fetch`` returns
            each row's whole gathered context and :meth:`attend_gathered` attends over what
            the layer passes.
        group: The KV cache group whose block tables the layer reads.
    """

    def __init__(self, kv_cache: PagedKVCache, layer_idx: int, metadata: AttentionMetadata,
                 sliding_window: int | None, gathered: bool = False, group: int = 0) -> None:
        self.kv_cache = kv_cache
        self.layer_idx = layer_idx
        self.metadata = metadata
        self.tables = metadata.groups[group]
        self.sliding_window = sliding_window
        self.gathered = gathered

    @property
    def offset(self) -> mx.array:
        """``[B]`` int32 positions of each request's first new token (RoPE offsets)."""
        return self.metadata.offsets

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write ``[B, kv_heads, L, D]`` keys/values into the pool; return them unchanged
        (the paged attention reads the pool, not these), or, for a ``gathered`` layer, each
        row's K/V gathered from the pool: ``[B, kv_heads, max_blocks * block_size, D]``,
        position ``j`` at index ``j``."""
        t = self.tables
        self.kv_cache.write(self.layer_idx, keys, values, t.slot_blocks, t.slot_offsets)
        if not self.gathered:
            return keys, values
        pools = self.kv_cache.key_caches, self.kv_cache.value_caches
        return tuple(dense(gather_kv(p[self.layer_idx], t.block_tables)).astype(keys.dtype)
                     for p in pools)

    def make_mask(self, *args, **kwargs) -> None:
        return None

    def keys_and_values(self) -> tuple[None, None]:
        """What a KV-shared layer (Gemma 3n) reads from its owner's cache before attending
        with ``cache=`` that same owner: placeholders, since :meth:`attend` reads the owner's
        pool, which already holds this step's K/V."""
        return None, None

    def attend(self, queries: mx.array, scale: float,
               sinks: mx.array | None = None) -> mx.array:
        """Paged attention of ``[B, q_heads, L, D]`` queries over this layer's pool, float or
        quantized (``sinks``: optional ``[q_heads]`` per-head sink logits, as gpt-oss); in
        two parts where the step's metadata has cascade tables for this layer's kind."""
        m, t = self.metadata, self.tables
        kv = PagedKV(self.kv_cache.key_caches[self.layer_idx],
                     self.kv_cache.value_caches[self.layer_idx], t.block_tables,
                     m.context_lens, m.offsets, scale, self.sliding_window, sinks=sinks)
        cascade = t.cascade.get(self.sliding_window)
        if cascade is not None:
            kv = kv._replace(block_tables=cascade.block_tables, key_start=cascade.key_start)
            return cascade_attention(queries, kv, cascade.prefix, kernel=m.kernel)
        if self.sliding_window is not None and self.sliding_window in t.window_tables:
            w = t.window_tables[self.sliding_window]
            kv = kv._replace(block_tables=w.block_tables, key_start=w.key_start)
        return paged_attention(queries, kv, kernel=m.kernel)

    def attend_gathered(self, queries: mx.array, keys: mx.array, values: mx.array,
                        scale: float, mask: mx.array | None,
                        sinks: mx.array | None = None) -> mx.array:
        """Attention of ``[B, q_heads, L, d]`` queries over the K/V the layer derived from
        :meth:`update_and_fetch`'s gathered context, with the paged causal / context / window
        mask; an ``mx.array`` ``mask`` from the model is an additive score term (MLA's RoPE
        scores) of shape ``[B, q_heads, L, S]``."""
        m = self.metadata
        bias = mask if isinstance(mask, mx.array) and mask.dtype != mx.bool_ else None
        return gathered_attention(queries, keys, values, m.context_lens, m.offsets,
                                  scale=scale, sliding_window=self.sliding_window,
                                  score_bias=bias, sinks=sinks)
