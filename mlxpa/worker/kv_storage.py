"""How each cache entry's K/V are stored (``--kv-cache-dtype``), and what a block costs.

``auto`` stores K/V in the model's compute dtype. ``int8``, ``int4`` and ``k8v4`` store them
as mlx-lm's affine group quantization (``mx.quantize`` along head_dim, per token, groups of
``--kv-group-size``; the format of mlx-lm's ``QuantizedKVCache``); ``k8v4`` keeps 8 bits for
keys and 4 for values, since keys are the more sensitive half (KIVI, Liu et al. 2024; vllm-metal's
TurboQuant). vLLM and SGLang store KV in fp8 for the same reason: the KV cache, not the
weights, limits how many rows run at once.

An entry the quantized path cannot run exactly keeps the compute dtype, and the KV pool line
says why: a ``gathered`` layer (latent attention, MLA: its layer computes K/V from the cached
latent, :mod:`mlxpa.worker.model_probe`), or a head width that is not a multiple of the group
size. A recurrent-state entry has no pool (its live state stays in the compute dtype,
:mod:`mlxpa.worker.state_store`); its snapshots take blocks of the pool.

The storage also groups the entries into KV cache groups (:mod:`mlxpa.core.kv_cache_groups`):
a block holds ``layout.num_slots`` layer slots, slot ``j`` with the pool shape of the ``j``-th
entry of every group, and one block is what a block table entry points to in any group.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from mlxpa.config import KV_BITS
from mlxpa.core.kv_cache_groups import KVCacheLayout, group_entries
from mlxpa.utils import cdiv
from mlxpa.worker.kv_cache import PoolSpec, block_bytes
from mlxpa.worker.model_probe import ModelGeometry


def _dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).split(".")[-1]


@dataclass(frozen=True, slots=True)
class KVStorage:
    """The storage of every cache entry for one ``--kv-cache-dtype``.

    Attributes:
        kv_cache_dtype: ``auto``, ``int8``, ``int4`` or ``k8v4``.
        dtype: The compute dtype (unquantized pools; quantized pools' scales and biases).
        specs: One :class:`PoolSpec` per cache entry, in the model's order.
        kept: ``(entry index, reason)`` per entry with K/V that keeps ``dtype`` although
            ``kv_cache_dtype`` quantizes.
        num_states: Recurrent-state entries (no pool; their state keeps ``dtype``).
        layout: The KV cache groups and the slots of a block.
        snapshot_bytes: Bytes of one snapshot of every recurrent entry's state (0: none).
    """

    kv_cache_dtype: str
    dtype: mx.Dtype
    specs: tuple[PoolSpec, ...]
    kept: tuple[tuple[int, str], ...] = ()
    num_states: int = 0
    layout: KVCacheLayout | None = None
    snapshot_bytes: int = 0

    @property
    def slot_specs(self) -> tuple[PoolSpec, ...]:
        """The pool of each layer slot of a block (``layout.num_slots`` of them)."""
        if self.layout is None or not self.layout.groups:
            return ()
        slots: dict[int, PoolSpec] = {}
        for group in self.layout.groups:
            for j, e in enumerate(group.entries):
                slots.setdefault(j, self.specs[e])
        return tuple(slots[j] for j in range(self.layout.num_slots))

    def entry_slots(self) -> dict[int, tuple[int, int]]:
        """Per K/V entry, ``(group, slot)`` of the pools it writes and reads."""
        if self.layout is None:
            return {}
        return {e: (g, j) for g, group in enumerate(self.layout.groups)
                for j, e in enumerate(group.entries)}

    @property
    def quantized(self) -> bool:
        """Whether any entry is stored quantized."""
        return any(s.k_bits for s in self.specs)

    def block_bytes(self, block_size: int) -> int:
        """Bytes one block takes over its layer slots, K and V (a model without K/V: one
        snapshot's, rounded up to 4; at least 1)."""
        if self.layout is None:
            return max(1, block_bytes(self.specs, block_size, self.dtype))
        if not self.layout.groups:
            return max(4, cdiv(self.snapshot_bytes, 4) * 4)
        return max(1, block_bytes(self.slot_specs, block_size, self.dtype))

    @property
    def token_bytes(self) -> int:
        """Bytes one token's K/V take over all entries."""
        return sum(s.token_bytes(self.dtype) for s in self.specs)

    def describe(self) -> str:
        """The storage in a few words for the KV pool line, e.g. ``int8 (8-bit, group 64,
        scales float32), 9,792 bytes per token; cache 3 kept in float32: <reason>``."""
        name = _dtype_name(self.dtype)
        head = name
        if self.kv_cache_dtype != "auto":
            k_bits, v_bits = KV_BITS[self.kv_cache_dtype]
            how = f"{k_bits}-bit" if k_bits == v_bits else f"{k_bits}-bit K, {v_bits}-bit V"
            group = next((s.group_size for s in self.specs if s.k_bits), None)
            head = (f"{self.kv_cache_dtype} ({how}, group {group}, scales {name})" if group
                    else f"{name} ({self.kv_cache_dtype} applies to no cache)")
        text = f"{head}, {self.token_bytes:,} bytes per token"
        for reason in sorted({r for _, r in self.kept}):
            which = [i for i, r in self.kept if r == reason]
            caches = f"cache {which[0]}" if len(which) == 1 else f"{len(which)} caches"
            text += f"; {caches} kept in {name}: {reason}"
        if self.num_states:
            entries = "1 entry" if self.num_states == 1 else f"{self.num_states} entries"
            text += f"; recurrent state in {name} ({entries}, "
            blocks = self.layout.snapshot_blocks if self.layout is not None else 0
            text += (f"a snapshot {self.snapshot_bytes / 2**20:,.2f} MiB in {blocks} block"
                     f"{'s' if blocks > 1 else ''})" if blocks else "no pool)")
        if self.layout is not None:
            text += _describe_groups(self)
        return text


def _describe_groups(storage: KVStorage) -> str:
    """How the layers are paged, for :meth:`KVStorage.describe`: e.g. ``; 18 layers in 6
    KV cache groups of 3 (full attention: 3 layers, 6,144 bytes per token; sliding window
    512: 15 layers, at most 544 tokens a request)``."""
    layout = storage.layout
    windows = [g.sliding_window for g in layout.groups]
    if len(set(windows)) <= 1 and layout.note is None and windows and windows[0] is None:
        return ""
    layers = sum(len(g.entries) for g in layout.groups)
    parts = []
    for w in sorted(set(windows), key=lambda w: (w is not None, w or 0)):
        entries = [e for g in layout.groups if g.sliding_window == w for e in g.entries]
        per_token = sum(storage.specs[e].token_bytes(storage.dtype) for e in entries)
        if w is None:
            parts.append(f"full attention: {len(entries)} layers, {per_token:,} bytes per "
                         "token")
        else:
            chunk = layout.max_chunk_tokens or w
            tokens = (layout.window_blocks(w, 1) * layout.block_size,
                      layout.window_blocks(w, chunk) * layout.block_size)
            parts.append(f"sliding window {w}: {len(entries)} layers, at most {tokens[0]:,} "
                         f"tokens a request ({tokens[1]:,} during a {chunk:,}-token prefill "
                         "chunk)")
    text = (f"; {layers} layers in {len(layout.groups)} KV cache groups of "
            f"{layout.num_slots} ({'; '.join(parts)})")
    if layout.note:
        text += f"; {layout.note}"
    return text


def _why_kept(kv_heads: int, k_dim: int, v_dim: int, gathered: bool,
              group_size: int) -> str | None:
    """Why an entry with K/V cannot be quantized exactly, or None."""
    if gathered:
        return ("its layer computes K/V from the cached latent (latent attention, MLA), "
                "which the quantized path cannot run exactly")
    if k_dim % group_size or v_dim % group_size:
        return (f"head width {k_dim}/{v_dim} is not a multiple of the group size "
                f"{group_size} (--kv-group-size)")
    return None


def kv_storage(geometry: ModelGeometry, kv_cache_dtype: str = "auto",
               group_size: int = 64, block_size: int | None = None) -> KVStorage:
    """The storage of ``geometry``'s cache entries for ``kv_cache_dtype`` and, with
    ``block_size``, their KV cache groups.

    Raises:
        ValueError: ``kv_cache_dtype`` is not ``auto`` or one of :data:`mlxpa.config.KV_BITS`.
    """
    if kv_cache_dtype != "auto" and kv_cache_dtype not in KV_BITS:
        raise ValueError(f"kv_cache_dtype must be auto or one of {', '.join(KV_BITS)}, got "
                         f"{kv_cache_dtype!r}")
    k_bits, v_bits = KV_BITS.get(kv_cache_dtype, (0, 0))
    specs, kept = [], []
    for i, c in enumerate(geometry.caches):
        why = _why_kept(*c.shape, c.gathered, group_size) if c.kv_heads and k_bits else None
        if why:
            kept.append((i, why))
        quantized = bool(c.kv_heads and k_bits and why is None)
        specs.append(PoolSpec(*c.shape, k_bits if quantized else 0,
                              v_bits if quantized else 0, group_size))
    storage = KVStorage(kv_cache_dtype, geometry.dtype, tuple(specs), tuple(kept),
                        len(geometry.recurrent))
    if block_size is None:
        return storage
    snapshot = sum(_nbytes(shape, dtype) for c in geometry.caches
                   for shape, dtype in filter(None, c.state_shapes))
    kinds = [(None if c.gathered else c.window, spec) if c.kv_heads else None
             for c, spec in zip(geometry.caches, specs)]
    layout = group_entries(kinds, block_size, geometry.recurrent)
    storage = KVStorage(kv_cache_dtype, geometry.dtype, tuple(specs), tuple(kept),
                        len(geometry.recurrent), layout, snapshot)
    if snapshot:
        blocks = cdiv(snapshot, storage.block_bytes(block_size))
        storage = KVStorage(kv_cache_dtype, geometry.dtype, tuple(specs), tuple(kept),
                            len(geometry.recurrent),
                            group_entries(kinds, block_size, geometry.recurrent, blocks),
                            snapshot)
    return storage


def _nbytes(shape: tuple[int, ...], dtype: mx.Dtype) -> int:
    n = dtype.size
    for d in shape:
        n *= d
    return n

