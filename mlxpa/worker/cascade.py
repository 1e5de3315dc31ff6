"""Cascade attention's per-layer inputs: which groups of a batch (decode rows, or prefill
chunks over a prefix cached before the step) attend over their shared prefix once, and the
tables of each row's own keys (numpy, converted once per step).

The scheduler reports the groups (``SchedulerOutput.cascade_groups``: rows sharing leading
full blocks). For each layer kind (full attention, or a sliding window of a given size) the
runner keeps a group where the cost rule (:func:`worth_cascading`) says the shared part pays:
in a window layer only the members whose window reaches into the prefix take part, and the
shared part starts at the earliest of their windows. Each member's own keys then start at the
group's prefix end; every other row keeps its whole visible context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlxpa.kernels.cascade_reference import CascadePrefix


@dataclass(frozen=True, slots=True)
class CascadeTables:
    """One layer kind's cascade inputs for a batch of ``B`` rows.

    Attributes:
        block_tables: ``[B, max_blocks]`` int32 blocks of each row's own keys.
        key_start: ``[B]`` int32 position of each row's first own key.
        prefix: The groups' shared keys (:class:`CascadePrefix`).
    """

    block_tables: mx.array
    key_start: mx.array
    prefix: CascadePrefix


# The cost rule's constants (see worth_cascading).
MIN_ROWS = 4
MIN_SAVED_ROW_BLOCKS = 256


def worth_cascading(rows: int, blocks: int) -> bool:
    """Whether ``rows`` decode rows sharing ``blocks`` blocks in a layer attend faster in two
    parts than each over its whole context: at least :data:`MIN_ROWS` rows, and at least
    :data:`MIN_SAVED_ROW_BLOCKS` block reads saved, ``(rows - 1) * blocks``.

    The cascade path costs a fixed part per layer (a second softmax pass over each row's own
    keys, the prefix gather, the merge: about 0.4 ms more than plain attention on the
    smallest groups) and reads the shared blocks once as a copy, which costs about what one
    row's in-place read does, so two or three rows gain nothing. Source: ``python
    benchmarks/cascade_cost.py`` on the development CPU (2 cores, OpenBLAS, shared with other
    jobs; minimum of 5 runs; float32 pools, 2 own blocks per row), plain / cascade time of
    one layer:

    - Gemma 3 270M's geometry (4 query heads over 1 KV head of 256), rows x shared blocks:
      2 x 256: 0.98; 3 x 256: 0.75; 4 x 64: 0.92, 4 x 256: 1.28; 8 x 32: 1.01,
      8 x 64: 1.05, 8 x 256: 1.47; 16 x 16: 1.02, 16 x 32: 1.16; 32 x 8: 1.09,
      32 x 16: 1.19, 32 x 256: 6.3; 64 x 4: 0.93, 64 x 8: 1.27; 128 x 2: 0.84,
      128 x 4: 1.07, 128 x 256: 7.2. The break-even lies near 256 saved block reads
      from 4 rows on.
    - A Llama-like geometry (16 query heads over 4 KV heads of 128) breaks even earlier
      (4 x 32: 1.15, 32 x 4: 1.19, 128 x 2: 0.86, 2 x 256: 1.01), so the rule is
      conservative there.
    """
    return rows >= MIN_ROWS and (rows - 1) * blocks >= MIN_SAVED_ROW_BLOCKS


Rule = Callable[[int, int], bool]


def cascade_tables(groups: Sequence[tuple[Sequence[int], int]], starts: np.ndarray,
                   tables: np.ndarray, num_blocks: np.ndarray, block_size: int,
                   window: int | None, rule: Rule | None = None) -> CascadeTables | None:
    """The cascade inputs of one layer kind, or None when no group pays there.

    Args:
        groups: Per group, its rows (indices into the batch) and the leading full blocks
            they share (the same block ids).
        starts: ``[B]`` int32 position of each row's (first) query.
        tables: ``[B, max_blocks]`` int32 block tables (right-padded).
        num_blocks: ``[B]`` blocks each row's context fills after this step's write.
        block_size: Tokens per block.
        window: The layer's sliding window in tokens, or None (full attention).
        rule: ``rule(rows, blocks)``: whether a group of ``rows`` members sharing ``blocks``
            blocks in this layer is worth it; None: :func:`worth_cascading`.
    """
    rule = rule or worth_cascading
    bs, b = block_size, len(starts)
    first = (np.maximum(starts - window + 1, 0) // bs if window is not None
             else np.zeros(b, np.int64)).astype(np.int64)  # first visible block per row
    own_first = first.copy()
    kept = []
    for rows, shared in groups:
        rows = [r for r in rows if first[r] < shared]  # its window reaches into the prefix
        lo = min((int(first[r]) for r in rows), default=shared)
        if len(rows) > 1 and rule(len(rows), shared - lo):
            kept.append((rows, lo, shared))
            own_first[rows] = shared
    if not kept:
        return None
    width = max(len(rows) for rows, _, _ in kept)
    prefix_tables = np.zeros((len(kept), max(n - lo for _, lo, n in kept)), np.int32)
    members = np.zeros((len(kept), width), np.int32)
    row_slot = np.full(b, len(kept) * width, np.int32)
    for g, (rows, lo, shared) in enumerate(kept):
        # the member whose window reaches furthest back holds every shared block in use (a
        # sliding-window group's tables hold 0 before each row's window)
        source = min(rows, key=lambda r: first[r])
        prefix_tables[g, :shared - lo] = tables[source, lo:shared]
        members[g, :len(rows)] = rows
        members[g, len(rows):] = rows[0]
        row_slot[rows] = g * width + np.arange(len(rows))
    own = np.zeros((b, int((num_blocks - own_first).max())), np.int32)
    for row in range(b):
        own[row, :num_blocks[row] - own_first[row]] = tables[row, own_first[row]:num_blocks[row]]
    lo_pos = np.array([lo * bs for _, lo, _ in kept], np.int32)
    end_pos = np.array([n * bs for _, _, n in kept], np.int32)
    return CascadeTables(
        mx.array(own), mx.array((own_first * bs).astype(np.int32)),
        CascadePrefix(mx.array(prefix_tables), mx.array(lo_pos), mx.array(end_pos),
                      mx.array(members), mx.array(row_slot)))
