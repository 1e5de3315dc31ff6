"""``mlxpa serve``'s start-up line about the KV pool (:func:`mlxpa.cli.serve.pool_line`):
block counts in words, "1 block" for one."""

from __future__ import annotations

from types import SimpleNamespace

from mlxpa.cli.serve import pool_line
from mlxpa.core.block_pool import BlockPool


def _engine(pool: BlockPool) -> SimpleNamespace:
    return SimpleNamespace(kv_cache_manager=SimpleNamespace(pool=pool),
                           runner=SimpleNamespace(kv_cache=SimpleNamespace(block_nbytes=2**20)),
                           config=SimpleNamespace(kv_release_after=30.0))


def test_a_tiny_segment_says_1_block():
    line = pool_line(_engine(BlockPool(40, 4, 2, 2)))  # a segment of 2: 1 usable (the null)
    assert line.startswith("1 block (2.0 MiB) now, growing by segments of 2 blocks ")
    assert "up to 39 blocks (40.0 MiB, --kv-memory)" in line


def test_a_pool_held_whole_counts_its_blocks():
    assert pool_line(_engine(BlockPool(2, 4))) == (
        "1 block (2.0 MiB, --kv-memory), held with its prefix cache for the server's life")
