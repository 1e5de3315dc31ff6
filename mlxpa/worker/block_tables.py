"""The runner's numpy copies of its requests' block tables, synced incrementally.

A step's metadata needs every scheduled request's block tables (one per KV cache group) as
arrays. Copying them whole each step costs O(context) per request; instead the runner keeps a
copy and re-reads only what can have changed: entries before ``num_computed_tokens`` never
change while the request holds them (a sliding-window group drops an entry only once no query
reads it, and no query reads it then), except the partial block copy-on-write replaces; a
preemption starts over.
"""

from __future__ import annotations

import numpy as np

from mlxpa.request import Request


class BlockTableCopies:
    """Per request, its block tables as int32 arrays (vLLM's ``BlockTable`` on the host).

    Args:
        block_size: Tokens per block.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        # request key -> (per group an array with room to grow, entries synced, preemptions)
        self._copies: dict[int, tuple[list[np.ndarray], int, int]] = {}

    def __len__(self) -> int:
        return len(self._copies)

    def __iter__(self):
        """The keys of the requests with a copy."""
        return iter(self._copies)

    def get(self, req: Request) -> list[np.ndarray]:
        """``req.block_tables`` as arrays (views of the kept copies), synced from the first
        entry that can have changed."""
        arrs, synced, npre = self._copies.get(req.key, (None, 0, -1))
        tables = req.block_tables
        n = len(tables[0]) if tables else 0
        if arrs is None or npre != req.num_preemptions or (arrs and n > len(arrs[0])):
            new = [np.zeros(max(16, 2 * n), np.int32) for _ in tables]
            if arrs is not None and npre == req.num_preemptions:
                for a, old in zip(new, arrs):
                    a[:synced] = old[:synced]
            else:
                synced = 0
            arrs = new
        start = min(synced, req.num_computed_tokens // self.block_size)
        for a, table in zip(arrs, tables):
            a[start:n] = table[start:]
        self._copies[req.key] = (arrs, n, req.num_preemptions)
        return [a[:n] for a in arrs]

    def drop(self, reqs: list[Request]) -> None:
        """Forget the copies of ``reqs`` (finished or preempted)."""
        for req in reqs:
            self._copies.pop(req.key, None)


def written_blocks(reqs: list[Request], counts: list[int], block_size: int) -> set[int]:
    """The pool blocks a step's K/V writes reach: for each request, every group's entries
    covering its ``counts`` tokens from ``num_computed_tokens`` on (drafts included)."""
    out: set[int] = set()
    for req, n in zip(reqs, counts):
        first, end = req.num_computed_tokens // block_size, -(-(req.num_computed_tokens + n)
                                                               // block_size)
        for table in req.block_tables:
            out.update(table[first:end])
    return out
