"""How many blocks the KV pool takes: what the memory budget holds, at most what a known input
can use.

A batch run knows its requests before the model loads, so the pool need not take the whole
memory budget up front (vLLM sizes it from free memory, for a server whose work is unknown). A
request holds at most ``ceil((prompt + max_tokens) / block_size)`` blocks per sample in a
full-attention group and its window's blocks in a sliding-window group
(:mod:`mlxpa.core.kv_cache_groups`; prefix sharing and copy-on-write only lower that,
preemption frees before it re-allocates), so the sum over all requests plus the null block
bounds every block requests hold at once: with a pool that size nothing is ever preempted
(blocks a window left stay in the prefix cache until one is needed).

Trade-off: the file run sizes the pool from the requests of its first window of rows (what
pass 2 reads and tokenizes before the model loads anyway; :mod:`mlxpa.batch.setup`), not from
a read of the whole input. An input that fits in one window gets exactly its need; a longer
one gets the whole budget. Rows over the context are refused before the model loads and never
size the pool.
"""

from __future__ import annotations

from collections.abc import Iterable

from mlxpa.core.kv_cache_groups import KVCacheLayout


def kv_blocks_needed(requests: Iterable[tuple[int, int, int]], layout: KVCacheLayout,
                     chunk: int, cap: int | None = None,
                     max_model_len: int | None = None) -> int:
    """Most KV blocks ``requests`` can hold at once, null block included.

    Args:
        requests: ``(prompt_tokens, max_tokens, n)`` per request; read lazily and only until
            the sum reaches ``cap`` (so a large input is not read through).
        layout: The model's KV cache groups (a sliding-window group holds at most its
            window's blocks) and recurrent snapshots.
        chunk: The most tokens a step computes for one request (``max_num_batched_tokens``).
        cap: Returned as soon as the need reaches it (the budget in blocks; None: no cap).
        max_model_len: Context cap on ``prompt_tokens + max_tokens`` (None: no cap).

    Returns:
        ``1 + sum(n * need(min(prompt + max_tokens, max_model_len)))``, ``need`` the blocks
        of :meth:`KVCacheLayout.blocks_needed` plus, with recurrent layers, a snapshot (and
        one more for a request with ``n > 1``, whose samples fork from one); at most
        ``cap``, at least 2 (a pool holds the null block and one block).
    """
    total = 1
    for prompt, max_tokens, n in requests:
        length = prompt + max_tokens
        if max_model_len is not None:
            length = min(length, max_model_len)
        snapshots = layout.snapshot_blocks * (1 + (n > 1))
        total += n * layout.blocks_needed(length, chunk) + snapshots
        if cap is not None and total >= cap:
            return cap
    return max(2, total)


def num_kv_blocks(budget_bytes: int, block_bytes: int, need_blocks: int | None = None) -> int:
    """Blocks of the KV pool, null block included: what ``budget_bytes`` holds at
    ``block_bytes`` per block (all layers, K and V), at most ``need_blocks`` (None: the whole
    budget), at least 2.

    Raises:
        ValueError: ``block_bytes`` below 1.
    """
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be >= 1, got {block_bytes}")
    budget = max(2, budget_bytes // block_bytes + 1)
    return budget if need_blocks is None else max(2, min(budget, need_blocks))
