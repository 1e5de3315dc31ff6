"""The CPU kernel's query tiles: key ranges computed by hand, and tiled prefill attention
against the float64 oracle of test_reference (causal, sliding window, trimmed window tables,
padded rows, chunks over a cached prefix)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxpa.kernels import PagedKV, cpu_paged_attention
from mlxpa.kernels.cpu_paged_attention import key_ranges
from tests.kernels.test_reference import SCALE, assert_matches, make_case, oracle, window_tables


def test_key_ranges_by_hand():
    # One fresh row of 10 queries over 10 keys, tiles of 4: causal upper bounds 4, 8, 10.
    assert key_ranges([0], 10, 10, 4, None) == [(0, 4, 0, 4), (4, 8, 0, 8), (8, 10, 0, 10)]
    # Rows starting at 0 and at 6 (a cached prefix): the later row needs 6 more keys.
    assert key_ranges([0, 6], 8, 14, 4, None) == [(0, 4, 0, 10), (4, 8, 0, 14)]
    # Window 3: query i sees keys (i - 3, i]; tile [4, 8) needs keys from 2 on.
    assert key_ranges([0], 8, 8, 4, 3) == [(0, 4, 0, 4), (4, 8, 2, 8)]
    # One tile covering everything.
    assert key_ranges([5], 3, 8, 128, None) == [(0, 3, 0, 8)]


def _run(case, tile, window=None, key_start=None, tables=None):
    tables = case["block_tables"] if tables is None else tables
    kv = PagedKV(mx.array(case["key_cache"], mx.float32),
                 mx.array(case["value_cache"], mx.float32), mx.array(tables),
                 mx.array(case["context_lens"]), mx.array(case["query_start"]), SCALE,
                 sliding_window=window,
                 key_start=None if key_start is None else mx.array(key_start))
    return cpu_paged_attention.paged_attention(mx.array(case["q"], mx.float32), kv,
                                               query_tile=tile)


@pytest.mark.parametrize("numpy_min_keys", [0, 1 << 30])   # numpy tiles, MLX-ops tiles
@pytest.mark.parametrize("tile", [1, 3, 8, 64])
@pytest.mark.parametrize("window", [None, 5, 16])
def test_tiled_prefill_matches_float64_oracle(tile, window, numpy_min_keys, monkeypatch):
    monkeypatch.setattr(cpu_paged_attention, "NUMPY_MIN_KEYS", numpy_min_keys)
    rng = np.random.default_rng(7)
    rows = [(0, 40), (16, 21), (3, 12), (50, 1), (0, 33)]
    case = make_case(rng, rows, q_heads=4, kv_heads=1)
    ref = oracle(case, SCALE, sliding_window=window)
    full = assert_matches(_run(case, tile, window), case, ref)
    untiled = np.array(_run(case, 1 << 20, window)).astype(np.float64)
    for b, n in enumerate(case["num_new"]):
        np.testing.assert_allclose(full[b, :, :n], untiled[b, :, :n], rtol=1e-6, atol=1e-6)
    if window is not None:
        tables, key_start = window_tables(case, window)
        assert_matches(_run(case, tile, window, key_start, tables), case, ref)


@pytest.mark.parametrize("rows", [[(20, 40)], [(0, 64)], [(30, 16), (30, 16)]])
@pytest.mark.parametrize("tile", [3, 8])
@pytest.mark.parametrize("window", [None, 5, 16])
def test_numpy_tiles_of_rows_at_equal_depths(rows, tile, window, monkeypatch):
    """Rows at equal depths (one long chunk, two alike), as a long document's chunks are: the
    numpy tiles against the float64 oracle, with window tables trimmed or not (the test above
    mixes depths, where no key of a tile is seen by every row)."""
    monkeypatch.setattr(cpu_paged_attention, "NUMPY_MIN_KEYS", 0)
    case = make_case(np.random.default_rng(11), rows, q_heads=4, kv_heads=1)
    ref = oracle(case, SCALE, sliding_window=window)
    assert_matches(_run(case, tile, window), case, ref)
    if window is not None:
        tables, key_start = window_tables(case, window)
        assert_matches(_run(case, tile, window, key_start, tables), case, ref)


def test_concurrent_numpy_prefills_restore_the_blas_threads():
    """Two threads running numpy prefill attention at once leave every BLAS library on the
    thread count it had (threadpoolctl's limit is the process's: unserialised, one caller
    restored the other's limit of 1 and BLAS stayed single-threaded), with equal results."""
    import threading

    from threadpoolctl import threadpool_info

    from mlxpa.kernels import cpu_prefill_attention as cpf

    def blas_threads():
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    rng = np.random.default_rng(0)
    b, h, kvh, length, keys, d = 1, 4, 2, 256, 1024, 64
    q, k, v = (mx.array(rng.standard_normal(s).astype(np.float32))
               for s in ((b, h, length, d), (b, kvh, keys, d), (b, kvh, keys, d)))
    pos = cpf.Positions(np.array([keys - length]), np.array([0]), np.array([keys]), None)
    ranges = key_ranges([keys - length], length, keys, 16, None)
    expected = np.array(cpf.sdpa_exp2(q, k, v, pos, d ** -0.5, ranges))
    before, outs = blas_threads(), []

    def work(n):
        for _ in range(n):
            outs.append(np.array(cpf.sdpa_exp2(q, k, v, pos, d ** -0.5, ranges)))

    for _ in range(3):
        threads = [threading.Thread(target=work, args=(3 + t,)) for t in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert blas_threads() == before
    assert len(outs) == 3 * 7 and all(np.array_equal(o, expected) for o in outs)
