"""``mlxpa plan``'s prediction under ``cache_salt``: rows of two salts share no block."""

from __future__ import annotations

from mlxpa.batch.plan import plan_token_lists

BS = 4


def test_plan_predicts_no_hit_across_salts():
    rows = [[1] * 12, [1] * 12, [1] * 12]
    same = plan_token_lists(rows, [4] * 3, BS)
    # the second and third rows hit 2 blocks (capped at len - 1: 11 tokens, 2 whole blocks)
    assert same == (36, 12 + 4 + 4, 12, 3 + 3)
    apart = plan_token_lists(rows, [4] * 3, BS, salts=["a", "b", "a"])
    assert apart == (36, 12 + 12 + 4, 12, 3 + 3 + 3)
