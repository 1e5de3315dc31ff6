"""The runner's per-layer cascade inputs (mlxpa.worker.cascade): the cost rule's values, and the
exact tables one hand-built decode batch gets in a full-attention layer and in window layers
(members whose window passes the prefix leave the group; a group left too small is dropped)."""

from __future__ import annotations

import numpy as np

from mlxpa.worker.cascade import cascade_tables, worth_cascading

BS = 4


def test_cost_rule_values():
    assert not worth_cascading(2, 1)            # two rows sharing one block: never
    assert not worth_cascading(3, 10_000)       # two or three rows gain nothing measurable
    assert worth_cascading(4, 86) and not worth_cascading(4, 85)      # 3 x 86 = 258 >= 256
    assert worth_cascading(128, 3) and not worth_cascading(128, 2)    # 254 < 256
    assert worth_cascading(32, 256)


def _batch():
    # Rows 0-3 share blocks 10, 11, 12 (12 keys); row 4 shares nothing. Queries at positions
    # 13, 14, 20, 27 and 5 (blocks 13.. are each row's own).
    tables = np.array([[10, 11, 12, 20, 0, 0, 0, 0],
                       [10, 11, 12, 21, 0, 0, 0, 0],
                       [10, 11, 12, 22, 23, 24, 0, 0],
                       [10, 11, 12, 25, 26, 27, 28, 0],
                       [30, 31, 0, 0, 0, 0, 0, 0]], np.int32)
    starts = np.array([13, 14, 20, 27, 5], np.int32)
    num_blocks = np.array([4, 4, 6, 7, 2])
    return tables, starts, num_blocks


def test_full_attention_layer_tables():
    tables, starts, num_blocks = _batch()
    got = cascade_tables([([0, 1, 2, 3], 3)], starts, tables, num_blocks, BS, None,
                         lambda rows, blocks: (rows, blocks) == (4, 3))
    assert np.array(got.block_tables).tolist() == [[20, 0, 0, 0], [21, 0, 0, 0],
                                                   [22, 23, 24, 0], [25, 26, 27, 28],
                                                   [30, 31, 0, 0]]
    assert np.array(got.key_start).tolist() == [12, 12, 12, 12, 0]
    p = got.prefix
    assert np.array(p.block_tables).tolist() == [[10, 11, 12]]
    assert np.array(p.key_start).tolist() == [0] and np.array(p.prefix_end).tolist() == [12]
    assert np.array(p.rows).tolist() == [[0, 1, 2, 3]]
    assert np.array(p.row_slot).tolist() == [0, 1, 2, 3, 4]


def test_window_layer_keeps_members_whose_window_reaches_the_prefix():
    tables, starts, num_blocks = _batch()
    seen = []

    def rule(rows, blocks):
        seen.append((rows, blocks))
        return True

    # Window 10: first visible positions 4, 5, 11, 18 -> blocks 1, 1, 2, 4: rows 0-2 reach
    # the prefix (blocks 1-2 of it, from the earliest window), row 3 does not.
    got = cascade_tables([([0, 1, 2, 3], 3)], starts, tables, num_blocks, BS, 10, rule)
    assert seen == [(3, 2)]
    p = got.prefix
    assert np.array(p.block_tables).tolist() == [[11, 12]]
    assert np.array(p.key_start).tolist() == [4] and np.array(p.prefix_end).tolist() == [12]
    assert np.array(p.rows).tolist() == [[0, 1, 2]]
    assert np.array(p.row_slot).tolist() == [0, 1, 2, 3, 3]
    # Row 3 keeps its window's blocks (from block 4), row 4 its whole context.
    assert np.array(got.key_start).tolist() == [12, 12, 12, 16, 0]
    assert np.array(got.block_tables).tolist()[3][:3] == [26, 27, 28]
    # Window 4: only row 0 and 1 reach block 2 (first visible 10 and 11): two members.
    seen.clear()
    assert cascade_tables([([0, 1, 2, 3], 3)], starts, tables, num_blocks, BS, 4,
                          lambda r, b: seen.append((r, b)) or r >= 3) is None
    assert seen == [(2, 1)]


def test_no_group_passes_the_default_rule_here():
    tables, starts, num_blocks = _batch()
    assert cascade_tables([([0, 1, 2, 3], 3)], starts, tables, num_blocks, BS, None) is None
