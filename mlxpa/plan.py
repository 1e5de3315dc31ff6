"""``mlxpa plan``: what prefix sharing will save on an input, without running the model.

Tokenizes every row (tokenizer only, no weights), orders the rows the way ``mlxpa run
--order prefix`` admits them, and replays that order through a simulated radix tree
(:class:`RadixCache` with no pool, no eviction) to predict each row's prefix cache hit
exactly as the engine computes it: whole blocks, capped at ``len(prompt) - 1``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from mlxpa.core.block_pool import cdiv
from mlxpa.core.prefix_order import prefix_order, shared_prefix_stats
from mlxpa.core.radix_cache import RadixCache
from mlxpa.data import InputOptions, read_rows
from mlxpa.prompts import prompt_token_ids

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper


@dataclass(frozen=True, slots=True)
class SharedPrefixReport:
    """One shared prefix: its length, how many rows share it, its first row's id and text."""

    num_tokens: int
    num_rows: int
    first_row_id: str | int
    preview: str


@dataclass(frozen=True, slots=True)
class Plan:
    """Predicted effect of prefix sharing on one input.

    Attributes:
        rows: Rows that can run (invalid rows are counted in ``invalid_rows``).
        invalid_rows: Rows with a validation error.
        prompt_tokens: Sum of prompt lengths.
        computed_prompt_tokens: Prompt tokens left to compute after prefix cache hits.
        predicted_hit_rate: ``1 - computed / prompt`` tokens.
        kv_blocks_without_sharing: Blocks to hold every row at once (prompt + ``max_tokens``)
            with no sharing.
        kv_blocks_with_sharing: The same with full prompt blocks shared (each distinct one
            counted once).
        block_size: Tokens per block used for the figures.
        shared_prefixes: Longest shared prefixes, longest first.
    """

    rows: int
    invalid_rows: int
    prompt_tokens: int
    computed_prompt_tokens: int
    predicted_hit_rate: float
    kv_blocks_without_sharing: int
    kv_blocks_with_sharing: int
    block_size: int
    shared_prefixes: list[SharedPrefixReport]

    def to_dict(self) -> dict:
        return asdict(self)


def plan_token_lists(token_lists: list[list[int]], max_tokens: list[int],
                     block_size: int) -> tuple[int, int, int, int]:
    """``(prompt_tokens, computed_prompt_tokens, blocks_without, blocks_with)`` for prompts
    admitted in prefix order with ``max_tokens`` outputs each."""
    tree = RadixCache(None, block_size)
    computed = 0
    for i in prefix_order(token_lists, block_size):
        ids = token_lists[i]
        computed += len(ids) - tree.match_prefix(ids[:len(ids) - 1]).num_tokens
        tree.insert(ids)
    without = sum(cdiv(len(t) + m, block_size) for t, m in zip(token_lists, max_tokens))
    tails = sum(cdiv(len(t) + m, block_size) - len(t) // block_size
                for t, m in zip(token_lists, max_tokens))
    return sum(map(len, token_lists)), computed, without, tree.total_blocks + tails


def plan_file(source: str, tokenizer: TokenizerWrapper, *, inputs: InputOptions | None = None,
              block_size: int = 16, max_tokens: int = 256, top_k: int = 5) -> Plan:
    """Predict prefix sharing for every row of ``source``.

    Args:
        source: Input path or ``"-"``.
        tokenizer: The model's mlx-lm ``TokenizerWrapper``.
        inputs: How to read the input (the same settings as ``mlxpa run``; a ``system``
            message changes which blocks are shared).
        block_size: Tokens per KV block.
        max_tokens: Output tokens per row when the row does not set ``max_tokens``.
        top_k: Shared prefixes to report.

    Raises:
        InputError: The input is malformed.
    """
    rows, ids, caps, invalid = [], [], [], 0
    for row in read_rows(source, inputs or InputOptions()):
        try:
            if row.error is not None:
                raise ValueError(row.error)
            ids.append(prompt_token_ids(row, tokenizer))
        except ValueError:
            invalid += 1
            continue
        rows.append(row)
        caps.append(row.params.get("max_tokens", max_tokens))
    prompt, computed, without, with_sharing = plan_token_lists(ids, caps, block_size)
    stats = shared_prefix_stats(ids, block_size, top_k)
    shared = [SharedPrefixReport(s.num_tokens, s.num_rows, rows[s.first_row].id,
                                 tokenizer.decode(ids[s.first_row][:s.num_tokens])[:80])
              for s in stats.top_prefixes]
    return Plan(len(rows), invalid, prompt, computed,
                1 - computed / prompt if prompt else 0.0, without, with_sharing, block_size,
                shared)
