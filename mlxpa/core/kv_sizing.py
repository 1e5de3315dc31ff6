"""How many KV blocks a known input can use at most, so the pool is sized to the work.

A batch run knows its requests before the model loads, so the pool need not take the whole
memory budget up front (vLLM sizes it from free memory, for a server whose work is unknown). A
request holds at most ``ceil((prompt + max_tokens) / block_size)`` blocks per sample
(prefix sharing and copy-on-write only lower that, preemption frees before it re-allocates),
so the sum over all requests plus the null block bounds every block ever held at once, the
prefix cache's included: with a pool that size nothing is ever evicted or preempted.

Trade-off: the run sizes the pool from the requests of its first window of rows (what pass 2
reads and tokenizes before the model loads anyway; :mod:`mlxpa.batch.setup`), not from a read
of the whole input. An input that fits in one window gets exactly its need; a longer one gets
the whole budget, even when its total need is below it (each window's need usually reaches
the budget, and reading ahead to find out would cost another pass over the input). Rows over
the context are refused before the model loads and never size the pool.
"""

from __future__ import annotations

from collections.abc import Iterable

from mlxpa.utils import cdiv


def kv_blocks_needed(requests: Iterable[tuple[int, int, int]], block_size: int,
                     cap: int, max_model_len: int | None = None) -> int:
    """Most KV blocks ``requests`` can hold at once, null block 0 included, at most ``cap``.

    Args:
        requests: ``(prompt_tokens, max_tokens, n)`` per request; read lazily and only until
            the sum reaches ``cap`` (so a large input is not read through).
        block_size: Tokens per block.
        cap: The budget in blocks (null block included); returned when the need reaches it.
        max_model_len: Context cap on ``prompt_tokens + max_tokens`` (None: no cap).

    Returns:
        ``min(cap, 1 + sum(n * ceil(min(prompt + max_tokens, max_model_len) / block_size)))``,
        at least 2 (a pool holds the null block and one block).
    """
    total = 1
    for prompt, max_tokens, n in requests:
        length = prompt + max_tokens
        if max_model_len is not None:
            length = min(length, max_model_len)
        total += n * cdiv(length, block_size)
        if total >= cap:
            return cap
    return max(2, total)
