"""Offline prefix planning: order prompts so shared prefixes run together, and size the sharing.

Pure Python (no mlx). Both functions walk the same block-level radix tree over all prompts
(the tree :class:`~mlxpa.core.radix_cache.RadixCache` would build if nothing were evicted) without
building nodes: a group of prompts is split by its next block of tokens, children in order of
first appearance, so the walk costs O(total prompt tokens).

NOTE: the tree is block-level, not token-level, because only whole blocks are ever shared:
two prompts that agree on 30 tokens share exactly one 16-token block either way, so a
token-level order would buy no extra hits, while block keys mean ``len/block_size`` dict
operations per prompt instead of ``len``. A trailing partial block is a key too, so identical
prompts still end up adjacent.

Prompts with different ``cache_salt`` never share blocks, so each salt is its own tree (as in
:class:`~mlxpa.core.radix_cache.RadixCache`): the salts' trees are walked one after the other,
in order of their first row, and no prefix is counted as shared across two salts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

# Admission orders of a file run: by shared prefix (this module), or the input's own order.
ORDERS = ("prefix", "input")
PREFIX_WINDOW = 4096  # prompts read, tokenized and ordered by shared prefix at a time


class SharedPrefix(NamedTuple):
    """A maximal shared prefix: ``num_rows`` prompts (the first is row ``first_row``) share
    their first ``num_tokens`` tokens in whole blocks (they may agree on a few more tokens, in a
    partial block that is never shared) and then diverge or end."""

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


def _walk(token_lists: list[list[int]], block_size: int,
          salts: Sequence[str | None] | None) -> tuple[list[int], int, list[SharedPrefix]]:
    """Depth-first over the block-level tree of each salt: returns the row order, the trees'
    distinct full blocks and every maximal shared prefix of at least one block."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if salts is not None and len(salts) != len(token_lists):
        raise ValueError(f"{len(salts)} salts for {len(token_lists)} prompts")
    order, num_blocks, shared = [], 0, []
    namespaces: dict[str | None, list[int]] = {}
    for r in range(len(token_lists)):
        namespaces.setdefault(None if salts is None else salts[r], []).append(r)
    stack = [(rows, 0) for rows in reversed(namespaces.values())]
    while stack:
        rows, pos = stack.pop()
        if len(rows) == 1:
            order.append(rows[0])
            num_blocks += len(token_lists[rows[0]]) // block_size - pos // block_size
            continue
        ended, groups = [], {}
        for r in rows:
            key = tuple(token_lists[r][pos:pos + block_size])
            (groups.setdefault(key, []) if key else ended).append(r)
        num_blocks += sum(len(key) == block_size for key in groups)
        if len(groups) == 1 and not ended:  # all still agree: go one block deeper
            stack.append((rows, pos + len(next(iter(groups)))))
            continue
        if pos >= block_size:
            shared.append(SharedPrefix(pos // block_size * block_size, len(rows), rows[0]))
        order.extend(ended)
        stack.extend((g, pos + len(key)) for key, g in reversed(groups.items()))
    return order, num_blocks, shared


def prefix_order(token_lists: list[list[int]], block_size: int,
                 salts: Sequence[str | None] | None = None) -> list[int]:
    """Indices of ``token_lists`` in depth-first order of their block-level radix tree.

    Prompts sharing a prefix are adjacent; at each node, prompts ending there come before the
    longer ones (so the longer ones hit their blocks), and children keep the order of their
    first row, so ties keep input order. With ``salts``, each salt's prompts form their own
    tree, the trees in order of their first row.

    Args:
        token_lists: Prompt token ids, one list per row.
        block_size: Tokens per block.
        salts: Each row's ``cache_salt`` (None: every row unsalted).

    Returns:
        A permutation of ``range(len(token_lists))``.

    Raises:
        ValueError: ``block_size < 1``, or not one salt per row.
    """
    return _walk(token_lists, block_size, salts)[0]


def shared_prefix_stats(token_lists: list[list[int]], block_size: int, top_k: int = 5,
                        salts: Sequence[str | None] | None = None) -> PrefixStats:
    """Tokens before and after prefix sharing, and the longest shared prefixes (only rows
    with the same salt share).

    Args:
        token_lists: Prompt token ids, one list per row.
        block_size: Tokens per block.
        top_k: Shared prefixes to report.
        salts: Each row's ``cache_salt`` (None: every row unsalted).

    Returns:
        The :class:`PrefixStats`.

    Raises:
        ValueError: ``block_size < 1``, or not one salt per row.
    """
    _, blocks, shared = _walk(token_lists, block_size, salts)
    tails = sum(len(t) % block_size for t in token_lists)
    shared.sort(key=lambda s: (-s.num_tokens, -s.num_rows, s.first_row))
    return PrefixStats(sum(map(len, token_lists)), blocks * block_size + tails, shared[:top_k])


__all__ = ["PrefixStats", "SharedPrefix", "prefix_order", "shared_prefix_stats"]
