"""Offline prefix planning: order prompts so shared prefixes run together, and size the sharing.

Pure Python (no mlx). Both functions walk the same block-level radix tree over all prompts
(the tree :class:`~mlxpa.radix_cache.RadixCache` would build if nothing were evicted) without
building nodes: a group of prompts is split by its next block of tokens, children in order of
first appearance, so the walk costs O(total prompt tokens).

NOTE: the tree is block-level, not token-level, because only whole blocks are ever shared
(DESIGN.md "KV cache rules"): two prompts that agree on 30 tokens share exactly one 16-token
block either way, so a token-level order would buy no extra hits, while block keys mean
``len/block_size`` dict operations per prompt instead of ``len``. A trailing partial block is a
key too, so identical prompts still end up adjacent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple


class SharedPrefix(NamedTuple):
    """A maximal shared prefix: ``num_rows`` prompts (the first is row ``first_row``) agree on
    their first ``num_tokens`` tokens (a multiple of the block size) and then diverge or end."""

    num_tokens: int
    num_rows: int
    first_row: int


class PrefixStats(NamedTuple):
    """Planning numbers for a prompt set.

    Attributes:
        num_prompt_tokens: Sum of prompt lengths.
        num_unique_tokens: Tokens after sharing: the tree's distinct full blocks (in tokens)
            plus every prompt's unshared partial tail. Prefills run a little above it, since a
            hit is capped at ``len(prompt) - 1`` and the cache may evict.
        top_prefixes: Longest maximal shared prefixes, longest (then most shared) first.
    """

    num_prompt_tokens: int
    num_unique_tokens: int
    top_prefixes: list[SharedPrefix]


class _Event(NamedTuple):
    rows: list[int]  # a group that shares ``depth`` blocks and splits or ends after them
    depth: int  # blocks shared by ``rows``
    new_blocks: int  # distinct full blocks of the tree created at this point


def _walk(token_lists: list[list[int]], block_size: int) -> Iterator[_Event]:
    """Depth-first over the block-level tree; singleton groups come out as leaves."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    stack = [(list(range(len(token_lists))), 0)]
    while stack:
        rows, depth = stack.pop()
        if len(rows) == 1:
            (r,) = rows
            yield _Event(rows, depth, len(token_lists[r]) // block_size - depth)
            continue
        ended, groups = [], {}
        for r in rows:
            key = tuple(token_lists[r][depth * block_size:(depth + 1) * block_size])
            if key:
                groups.setdefault(key, []).append(r)
            else:
                ended.append(r)
        if len(groups) == 1 and not ended:  # all still agree: go one block deeper
            stack.append((rows, depth + 1))
            continue
        full = sum(len(k) == block_size for k in groups)
        yield _Event(ended, depth, 0)
        yield _Event([], depth, full)  # counted apart so ``ended`` stays the emitted rows
        stack.extend((g, depth + 1) for g in reversed(list(groups.values())))
        yield _Event(rows, depth, -1)  # marks a branch point shared by ``rows``


def prefix_order(token_lists: list[list[int]], block_size: int) -> list[int]:
    """Indices of ``token_lists`` in depth-first order of their block-level radix tree.

    Prompts sharing a prefix are adjacent; at each node, prompts ending there come before the
    longer ones (so the longer ones hit their blocks), and children keep the order of their
    first row, so ties keep input order.

    Args:
        token_lists: Prompt token ids, one list per row.
        block_size: Tokens per block.

    Returns:
        A permutation of ``range(len(token_lists))``.

    Raises:
        ValueError: ``block_size < 1``.
    """
    return [r for ev in _walk(token_lists, block_size) if ev.new_blocks >= 0 for r in ev.rows]


def shared_prefix_stats(token_lists: list[list[int]], block_size: int,
                        top_k: int = 5) -> PrefixStats:
    """Tokens before and after prefix sharing, and the longest shared prefixes.

    Args:
        token_lists: Prompt token ids, one list per row.
        block_size: Tokens per block.
        top_k: Shared prefixes to report.

    Returns:
        The :class:`PrefixStats`.

    Raises:
        ValueError: ``block_size < 1``.
    """
    blocks, shared = 0, []
    for ev in _walk(token_lists, block_size):
        if ev.new_blocks >= 0:
            blocks += ev.new_blocks
        elif ev.depth > 0:
            shared.append(SharedPrefix(ev.depth * block_size, len(ev.rows), min(ev.rows)))
    tails = sum(len(t) % block_size for t in token_lists)
    shared.sort(key=lambda s: (-s.num_tokens, -s.num_rows, s.first_row))
    return PrefixStats(sum(map(len, token_lists)), blocks * block_size + tails, shared[:top_k])


__all__ = ["PrefixStats", "SharedPrefix", "prefix_order", "shared_prefix_stats"]
