"""A request's recurrent state as raw bytes, to store in KV blocks and read back exactly.

A snapshot (:mod:`mlxpa.core.kv_cache_manager`) holds the state of every recurrent entry of
one request at one position: each state array's bytes, in entry and slot order, padded to
the snapshot's whole blocks (:meth:`~mlxpa.worker.kv_cache.PagedKVCache.write_bytes`). Bytes
move unchanged (views, gathers and scatters: no arithmetic), so a restored state is
bit-identical to the saved one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx

from mlxpa.worker.model_probe import ModelGeometry

if TYPE_CHECKING:
    from mlxpa.request import Request
    from mlxpa.worker.kv_cache import PagedKVCache
    from mlxpa.worker.state_store import RecurrentStateStore

StateArrays = dict[int, list[mx.array | None]]


class StateCodec:
    """Packs one request's recurrent state into bytes and unpacks it.

    Args:
        geometry: The probed model (its recurrent entries and their state shapes).
    """

    def __init__(self, geometry: ModelGeometry) -> None:
        self.shapes = {e: geometry.caches[e].state_shapes for e in geometry.recurrent}
        self.nbytes = sum(_nbytes(*s) for shapes in self.shapes.values()
                          for s in shapes if s is not None)

    def pack(self, state: StateArrays, size: int) -> mx.array:
        """``state`` (per entry, one request's ``[1, ...]`` arrays) as ``size`` uint8 bytes
        (zeros after the state; an array the state lacks: zeros)."""
        parts = []
        for e, shapes in self.shapes.items():
            for a, spec in zip(state[e], shapes):
                if spec is None:
                    continue
                shape, dtype = spec
                a = mx.zeros(shape, dtype) if a is None else a.astype(dtype)
                parts.append(mx.contiguous(a.reshape(-1)).view(mx.uint8))
        if size > self.nbytes:
            parts.append(mx.zeros((size - self.nbytes,), mx.uint8))
        return mx.concatenate(parts)

    def unpack(self, data: mx.array) -> StateArrays:
        """The state :meth:`pack` wrote into ``data`` (uint8, at least ``nbytes``)."""
        out, off = {}, 0
        for e, shapes in self.shapes.items():
            arrays: list[mx.array | None] = []
            for spec in shapes:
                if spec is None:
                    arrays.append(None)
                    continue
                shape, dtype = spec
                n = _nbytes(shape, dtype)
                arrays.append(mx.contiguous(data[off:off + n]).view(dtype).reshape(shape))
                off += n
            out[e] = arrays
        return out


def restore_states(store: RecurrentStateStore, kv_cache: PagedKVCache, codec: StateCodec,
                   restores: list[tuple[Request, list[int]]]) -> None:
    """Give each request the recurrent state of its snapshot (a prefix hit's, a fork's) at
    its ``num_computed_tokens``; read and evaluated now, before the step writes the pools, so
    the writes can take over the pools' buffers."""
    states = [codec.unpack(kv_cache.read_bytes(blocks)) for _, blocks in restores]
    mx.eval([a for st in states for arrays in st.values() for a in arrays if a is not None])
    for (req, _), state in zip(restores, states):
        store.restore(req.key, req.num_computed_tokens, state)


def save_states(store: RecurrentStateStore, kv_cache: PagedKVCache, codec: StateCodec,
                saves: list[tuple[Request, list[int]]]) -> None:
    """Write each request's recurrent state after the step's forward into its snapshot
    blocks (lazily: evaluated with the step's pools)."""
    for req, blocks in saves:
        kv_cache.write_bytes(blocks, codec.pack(store.state(req.key), len(blocks)
                                                * kv_cache.block_nbytes))


def _nbytes(shape: tuple[int, ...], dtype: mx.Dtype) -> int:
    n = dtype.size
    for d in shape:
        n *= d
    return n
