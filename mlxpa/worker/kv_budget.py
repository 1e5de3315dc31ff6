"""The KV pool's memory budget: bytes (``--kv-memory``, else a share of physical memory),
blocks it holds, and the bytes one block of a model takes in a ``--kv-cache-dtype``. Shared by
the engine, ``mlxpa run``'s sizing, ``mlxpa plan`` and ``mlxpa bench``."""

from __future__ import annotations

from mlxpa.config import EngineConfig, kv_budget_bytes
from mlxpa.worker.kv_storage import kv_storage
from mlxpa.worker.model_probe import probe_model


def kv_budget_blocks(one_block_bytes: int, config: EngineConfig) -> int:
    """Blocks (null block included) the memory budget allows: ``config.num_blocks``, else
    :func:`kv_budget_bytes` over ``one_block_bytes`` (all layers, K and V)."""
    if config.num_blocks:
        return config.num_blocks
    return max(2, kv_budget_bytes(config) // one_block_bytes + 1)


def model_block_bytes(model, block_size: int, kv_cache_dtype: str = "auto",
                      kv_group_size: int = 64) -> int:
    """Bytes one KV block of ``model`` takes (all layers, K and V) stored as
    ``kv_cache_dtype``, from a probe forward."""
    return kv_storage(probe_model(model), kv_cache_dtype, kv_group_size).block_bytes(block_size)
