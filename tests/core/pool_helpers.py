"""The tiny pool the core tests share: ``block_size=4``, ``num_blocks=11`` (block 0 is the null
block, so ids 1..10 can be handed out)."""

from __future__ import annotations

from mlxpa.core.block_pool import BlockPool
from mlxpa.request import Request
from mlxpa.sampling_params import SamplingParams

BS = 4
NB = 11
USABLE = NB - 1


def make_pool() -> BlockPool:
    return BlockPool(NB, BS)


def make_request(request_id: object, tokens: list[int] | int) -> Request:
    if isinstance(tokens, int):
        tokens = list(range(100, 100 + tokens))
    return Request(request_id, list(tokens), SamplingParams(max_tokens=16))


def snapshot(pool: BlockPool) -> tuple[list[int], list[int]]:
    """Ref counts and free-queue order (the whole mutable state of a pool of one segment)."""
    return list(pool._ref_cnt), pool.free_queue()


def ref_cnts(pool: BlockPool) -> list[int]:
    return [pool.ref_cnt(b) for b in range(NB)]


