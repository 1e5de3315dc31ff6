"""Groups of requests that share leading KV blocks (cascade attention's groups).

Pure Python (no mlx). Requests that share a prefix through the radix tree or a fork hold the
same block ids at the start of their block tables, so a shared prefix is a run of leading
block ids common to several tables; no tree walk is needed. Each step the scheduler partitions
its decode requests, and apart its prefill chunks, into groups with the number of leading full
blocks each group shares, and the model runner attends over a group's prefix once for all its
rows (Hydragen, Juravsky et al. 2024; FlashInfer's cascade inference; vLLM v1's
``num_common_prefix_blocks``, one prefix for the whole batch there).

A request sits in one group at most, and the partition maximises the block reads saved,
``sum((rows - 1) * blocks)``: tables are bucketed by their first block (a batch without sharing
costs one dictionary pass), the tree of longest common prefixes of a bucket is built top down,
and a tree knapsack picks the groups. Whether a group pays in a given layer is the model
runner's decision (``mlxpa.worker.cascade``).
"""

from __future__ import annotations

from typing import NamedTuple


class CascadeGroup(NamedTuple):
    """Requests of one step that share their first ``num_blocks`` blocks.

    Attributes:
        indices: Positions in ``SchedulerOutput.requests`` of the members (at least two),
            ascending.
        num_blocks: Leading full blocks every member holds (the same block ids), at least 1.
    """

    indices: tuple[int, ...]
    num_blocks: int


def _lcp(a: list[int], b: list[int], bound: int) -> int:
    """Length of the common prefix of ``a`` and ``b``, at most ``bound`` (a binary search on
    slice equality: the comparisons run in C)."""
    lo, hi = 0, min(len(a), len(b), bound)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


_NONE = -(1 << 62)  # no partition leaves this many members ungrouped


class _Node(NamedTuple):
    """A node of the longest-common-prefix tree of a bucket of prefixes."""

    depth: int              # blocks every member of the subtree shares
    leaves: list[int]       # members whose prefix ends here or that no sibling shares
    children: list[_Node]   # subtrees of at least two members, deeper
    partial: list[list[int]]  # saving per number of ungrouped members, leaves then each child
    best: list[int]         # best[j]: most saving in the subtree with exactly j ungrouped


def _max_plus(a: list[int], b: list[int]) -> list[int]:
    """``c[n] = max(a[i] + b[n - i])``: the best of two disjoint parts by ungrouped count."""
    c = [_NONE] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        if x > _NONE:
            for j, y in enumerate(b):
                if y > _NONE and x + y > c[i + j]:
                    c[i + j] = x + y
    return c


def _tree(members: list[int], prefixes: dict[int, list[int]]) -> _Node:
    """The subtree of ``members`` (at least two, sharing their first block), with the best
    saving for each number of members left ungrouped (a tree knapsack)."""
    ref = prefixes[members[0]]
    depth = len(ref)
    head = ref
    for i in members[1:]:
        if prefixes[i][:depth] != head:  # one comparison while the depth holds
            depth = _lcp(ref, prefixes[i], depth)
            head = ref[:depth]
    by_next: dict[int, list[int]] = {}
    leaves = []
    for i in members:
        if len(prefixes[i]) > depth:
            by_next.setdefault(prefixes[i][depth], []).append(i)
        else:
            leaves.append(i)
    leaves += [sub[0] for sub in by_next.values() if len(sub) == 1]
    children = [_tree(sub, prefixes) for sub in by_next.values() if len(sub) > 1]
    partial = [[_NONE] * len(leaves) + [0]]  # leaves alone: all of them ungrouped
    for child in children:
        partial.append(_max_plus(partial[-1], child.best))
    h = partial[-1]
    # One group at this depth takes g >= 2 of the ungrouped: (g - 1) * depth more.
    best, top = list(h), _NONE
    for j in range(len(h) - 3, -1, -1):
        if h[j + 2] > _NONE:
            top = max(top, h[j + 2] + (j + 2) * depth)
        if top > _NONE:
            best[j] = max(best[j], top - (j + 1) * depth)
    return _Node(depth, leaves, children, partial, best)


def _groups(node: _Node, ungrouped: int, out: list[tuple[list[int], int]]) -> list[int]:
    """Append to ``out`` the groups of the best partition of ``node``'s subtree that leaves
    ``ungrouped`` members ungrouped (a group here preferred on ties); return those members."""
    h = node.partial[-1]
    total = ungrouped
    for j in range(len(h) - 1, ungrouped + 1, -1):   # the largest group that is best
        if h[j] > _NONE and h[j] + (j - ungrouped - 1) * node.depth == node.best[ungrouped]:
            total = j
            break
    pool = []
    for k in range(len(node.children), 0, -1):       # undo the knapsack, last child first
        before, child = node.partial[k - 1], node.children[k - 1]
        for j in range(len(child.best)):
            rest = total - j
            if (0 <= rest < len(before) and before[rest] > _NONE and child.best[j] > _NONE
                    and before[rest] + child.best[j] == node.partial[k][total]):
                pool += _groups(child, j, out)
                total = rest
                break
    pool += node.leaves
    if len(pool) > ungrouped:
        out.append((pool[ungrouped:], node.depth))
    return pool[:ungrouped]


def common_prefix_groups(block_tables: list[list[int]],
                         num_full_blocks: list[int]) -> list[CascadeGroup]:
    """Partition requests into groups that share leading full blocks.

    Args:
        block_tables: Per request, its block table (pool block ids, position order).
        num_full_blocks: Per request, how many leading blocks hold only keys before its
            query (its ``num_computed_tokens // block_size``); only these may be shared.

    Returns:
        The groups (at least two members and one shared block each), ordered by their
        first member; requests in no group share nothing worth grouping. The partition
        maximises ``sum((len(indices) - 1) * num_blocks)``.
    """
    by_first: dict[int, list[int]] = {}
    for i, (table, full) in enumerate(zip(block_tables, num_full_blocks)):
        if full > 0:
            by_first.setdefault(table[0], []).append(i)
    groups = []
    for members in by_first.values():
        if len(members) > 1:
            prefixes = {i: block_tables[i][:num_full_blocks[i]] for i in members}
            tree = _tree(members, prefixes)
            _groups(tree, max(range(len(tree.best)), key=tree.best.__getitem__), groups)
    return sorted(CascadeGroup(tuple(sorted(m)), blocks) for m, blocks in groups)


__all__ = ["CascadeGroup", "common_prefix_groups"]
