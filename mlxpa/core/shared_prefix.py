"""Prefixes requests share before the tree holds them: in-batch deduplication and where a
recurrent model's state must be snapshotted.

Pure Python (no mlx). Two decisions of admission read the prompts of other requests, not the
radix tree:

- a waiting request that shares blocks with a running request still prefilling them waits and
  reads them from the cache once they are computed, instead of computing them a second time
  (SGLang's in-batch prefix deduplication);
- a recurrent model's hit needs a snapshot of the state where the shared prefix ends, and a
  state exists only while its request passes that position: so when a request is admitted,
  the ends of the prefixes it shares with the next waiting requests, the running ones and the
  tree's blocks become its snapshot points (SGLang's Mamba radix cache keeps states at the
  nodes requests end at; this keeps them where the next requests will hit, known offline from
  the queue, online from what the tree already holds).

Both compare a request only with requests of the same ``cache_salt``: another salt's blocks
are never its hits, so waiting for them or snapshotting for them would be wasted (and the
wait itself would be a timing signal across salts).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mlxpa.core.kv_cache_manager import KVCacheManager
from mlxpa.request import Request

# How many waiting requests a recurrent request's admission compares its prompt with.
SNAPSHOT_LOOKAHEAD = 256
# The most snapshot points one admission adds (each costs a snapshot's blocks).
MAX_SNAPSHOT_POINTS = 4


def shared_blocks(a: Sequence[int], b: Sequence[int], block_size: int, limit: int) -> int:
    """Leading full blocks ``a`` and ``b`` share, at most ``limit``."""
    n, bs = 0, block_size
    while n < limit and a[n * bs:(n + 1) * bs] == b[n * bs:(n + 1) * bs]:
        n += 1
    return n


def _hit_limit(req: Request, block_size: int) -> int:
    """Blocks a hit of ``req`` can cover (the last token, scored tokens are computed)."""
    return (req.num_tokens - 1 - req.num_scored_tokens) // block_size


def shares_uncached_prefix(req: Request, num_cached: int, running: Iterable[Request],
                           kv: KVCacheManager, scheduled_end: dict[Request, int]) -> bool:
    """Whether ``req`` should wait for a running request of its ``cache_salt`` still
    prefilling blocks it shares beyond its cached ``num_cached`` tokens (and read them from
    the cache later).

    With recurrent layers the wait pays only if the other request saves its state where the
    shared part ends: it does when that is a snapshot point of it already, or it has not
    passed it (the point is added, so its next chunk ends there).

    Args:
        scheduled_end: Position each request scheduled so far this step reaches.
    """
    if not kv.enable_prefix_caching:
        return False
    bs = kv.block_size
    limit = _hit_limit(req, bs)
    if limit * bs <= num_cached:
        return False
    prompt = req.prompt_token_ids
    first = prompt[:bs]
    for other in running:
        if (other.num_computed_tokens >= other.num_prompt_tokens
                or other.cache_salt != req.cache_salt or other.prompt_token_ids[:bs] != first):
            continue
        shared = shared_blocks(prompt, other.prompt_token_ids, bs,
                               min(limit, other.num_prompt_tokens // bs))
        position = shared * bs
        if position <= num_cached:
            continue
        if not kv.recurrent or position in kv.snapshot_points(other):
            return True
        if scheduled_end.get(other, other.num_computed_tokens) < position:
            kv.add_snapshot_point(other, position)
            return True
    return False


def snapshot_points(req: Request, num_cached: int, waiting: Iterable[Request],
                    running: Iterable[Request], kv: KVCacheManager) -> list[int]:
    """Where ``req`` (being admitted with ``num_cached`` tokens from the cache) should
    snapshot its recurrent state: the block-aligned ends of the prefixes it shares with the
    next :data:`SNAPSHOT_LOOKAHEAD` waiting requests and the running ones of its salt, and of
    the tree's blocks it matches without a snapshot; past ``num_cached``, the
    :data:`MAX_SNAPSHOT_POINTS` largest."""
    bs = kv.block_size
    limit = _hit_limit(req, bs)
    prompt = req.prompt_token_ids
    first = prompt[:bs]
    salt = req.cache_salt
    ends = {min(kv.cached_prefix_blocks(prompt, salt), limit)}
    for k, other in enumerate(waiting):
        if k >= SNAPSHOT_LOOKAHEAD:
            break
        if other.cache_salt == salt and other.prompt_token_ids[:bs] == first:
            ends.add(shared_blocks(prompt, other.prompt_token_ids, bs,
                                   min(limit, _hit_limit(other, bs))))
    for other in running:
        if other.cache_salt == salt and other.prompt_token_ids[:bs] == first:
            ends.add(shared_blocks(prompt, other.prompt_token_ids, bs,
                                   min(limit, other.num_prompt_tokens // bs)))
    points = sorted(e * bs for e in ends if e * bs > num_cached)
    return points[-MAX_SNAPSHOT_POINTS:]


__all__ = ["shared_blocks", "shares_uncached_prefix", "snapshot_points"]
