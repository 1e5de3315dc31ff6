"""Tests for mlxpa.kernels.reference and mlxpa.kernels.cpu_paged_attention: paged attention
against a dense float64 numpy oracle (every case runs on both implementations).

The oracle is independent of the code under test: it rebuilds each sequence's contiguous K/V
from the pool through its block table with plain numpy indexing, then applies causal, context
and sliding-window rules and a float64 softmax per query. Pools are filled with large finite
garbage everywhere a sequence does not own a valid token (the null block 0, unused blocks, the
tail of each last block), so any leak of a masked key or value shows up.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from mlxpa.kernels import PagedKV, cpu_paged_attention, reference
from mlxpa.kernels.reference import attention_mask, gather_kv

BS = 16
D = 32
GARBAGE = 1e30  # finite in float32 and bfloat16; float16 pools use a smaller value


# ----------------------------------------------------------------------------- test case builder


def make_case(rng: np.random.Generator, rows: list[tuple[int, int]], *, q_heads: int = 4,
              kv_heads: int = 2, block_size: int = BS, head_dim: int = D,
              garbage: float = GARBAGE, spare_blocks: int = 3) -> dict:
    """Random paged inputs for ``rows`` of ``(query_start, num_new_tokens)``.

    Every row owns distinct, shuffled (non-contiguous) pool blocks holding
    ``query_start + num_new_tokens`` valid tokens; all other pool entries hold ``±garbage``.
    """
    ctx = [s + n for s, n in rows]
    nblocks = [math.ceil(c / block_size) for c in ctx]
    num_blocks = 1 + sum(nblocks) + spare_blocks
    ids = rng.permutation(np.arange(1, num_blocks))
    tables, used = [], 0
    for nb in nblocks:
        tables.append([int(b) for b in ids[used:used + nb]])
        used += nb
    shape = (num_blocks, kv_heads, block_size, head_dim)
    key_cache = garbage * rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.5, 1, size=shape)
    value_cache = garbage * rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.5, 1, size=shape)
    for table, c in zip(tables, ctx, strict=True):
        for pos in range(c):
            blk, off = table[pos // block_size], pos % block_size
            key_cache[blk, :, off] = rng.standard_normal((kv_heads, head_dim))
            value_cache[blk, :, off] = rng.standard_normal((kv_heads, head_dim))
    width = max(nblocks)
    block_tables = np.zeros((len(rows), width), np.int32)  # padded with the null block
    for b, table in enumerate(tables):
        block_tables[b, :len(table)] = table
    length = max(n for _, n in rows)
    # Padded query rows get finite random values too (as a padded batch would).
    q = rng.standard_normal((len(rows), q_heads, length, head_dim))
    return {
        "q": q, "key_cache": key_cache, "value_cache": value_cache,
        "block_tables": block_tables, "context_lens": np.array(ctx, np.int32),
        "query_start": np.array([s for s, _ in rows], np.int32),
        "num_new": [n for _, n in rows], "tables": tables, "block_size": block_size,
    }


def oracle(case: dict, scale: float, sliding_window: int | None = None,
           dtype=np.float64) -> list[np.ndarray]:
    """Per row, ``[q_heads, num_new, head_dim]`` float64 attention outputs (valid queries only).

    ``dtype``: round the inputs through this numpy dtype first (to compare half-precision runs
    on the same values the kernel sees); the arithmetic is always float64.
    """
    q = case["q"].astype(dtype).astype(np.float64)
    kc = case["key_cache"].astype(dtype).astype(np.float64)
    vc = case["value_cache"].astype(dtype).astype(np.float64)
    bs = case["block_size"]
    q_heads, kv_heads = q.shape[1], kc.shape[1]
    group = q_heads // kv_heads
    outs = []
    for b, table in enumerate(case["tables"]):
        c = int(case["context_lens"][b])
        start = int(case["query_start"][b])
        pos = np.arange(c)
        blocks = np.array(table)[pos // bs]
        k = kc[blocks, :, pos % bs].transpose(1, 0, 2)  # [kv_heads, c, D]
        v = vc[blocks, :, pos % bs].transpose(1, 0, 2)
        out = np.empty((q_heads, case["num_new"][b], q.shape[3]))
        for i in range(case["num_new"][b]):
            qp = start + i
            visible = pos <= qp
            if sliding_window is not None:
                visible &= pos > qp - sliding_window
            for h in range(q_heads):
                kh = h // group
                s = (k[kh, visible] @ q[b, h, i]) * scale
                p = np.exp(s - s.max())
                p /= p.sum()
                out[h, i] = p @ v[kh, visible]
        outs.append(out)
    return outs


def cpu_numpy(q: mx.array, kv: PagedKV) -> mx.array:
    """The CPU kernel with every prefill chunk attending in numpy, however few its keys."""
    keep, cpu_paged_attention.NUMPY_MIN_KEYS = cpu_paged_attention.NUMPY_MIN_KEYS, 0
    try:
        return cpu_paged_attention.paged_attention(q, kv)
    finally:
        cpu_paged_attention.NUMPY_MIN_KEYS = keep


IMPLS = {"reference": reference.paged_attention, "cpu": cpu_paged_attention.paged_attention,
         "cpu-numpy": cpu_numpy}
_impl = [reference.paged_attention]


@pytest.fixture(params=sorted(IMPLS), autouse=True)
def impl(request):
    """Runs each test on the reference and on the CPU kernel (prefill in MLX ops, in numpy)."""
    _impl[0] = IMPLS[request.param]
    yield request.param
    _impl[0] = reference.paged_attention


def run(case: dict, scale: float, *, dtype=mx.float32, sliding_window: int | None = None,
        key_start: np.ndarray | None = None, block_tables: np.ndarray | None = None
        ) -> mx.array:
    tables = case["block_tables"] if block_tables is None else block_tables
    kv = PagedKV(mx.array(case["key_cache"]).astype(dtype),
                 mx.array(case["value_cache"]).astype(dtype), mx.array(tables),
                 mx.array(case["context_lens"]), mx.array(case["query_start"]), scale,
                 sliding_window=sliding_window,
                 key_start=None if key_start is None else mx.array(key_start))
    return _impl[0](mx.array(case["q"]).astype(dtype), kv)


def assert_matches(out: mx.array, case: dict, ref: list[np.ndarray], rtol: float = 1e-5,
                   atol: float = 1e-5) -> np.ndarray:
    got = np.array(out.astype(mx.float32)).astype(np.float64)
    assert got.shape == case["q"].shape
    for b, expected in enumerate(ref):
        n = case["num_new"][b]
        np.testing.assert_allclose(got[b, :, :n], expected, rtol=rtol, atol=atol,
                                   err_msg=f"row {b}")
    # Padded query positions are garbage but must be finite.
    assert np.isfinite(got).all()
    return got


def window_tables(case: dict, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Block tables trimmed to the blocks a window can still see, and each row's key_start
    (the first kept block's first position), as the model runner builds them."""
    bs = case["block_size"]
    starts, ctx = case["query_start"], case["context_lens"]
    first = np.maximum(starts - window + 1, 0) // bs
    nblocks = -(-ctx // bs)
    trimmed = np.zeros((len(starts), int((nblocks - first).max())), np.int32)
    for b in range(len(starts)):
        kept = case["block_tables"][b, first[b]:nblocks[b]]
        trimmed[b, :len(kept)] = kept
    return trimmed, (first * bs).astype(np.int32)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


SCALE = D ** -0.5


# ----------------------------------------------------------------------------- gather_kv


def test_gather_kv_exact():
    cache = np.arange(5 * 2 * 3 * 2, dtype=np.float32).reshape(5, 2, 3, 2)
    tables = np.array([[3, 1], [4, 0]], np.int32)
    got = np.array(gather_kv(mx.array(cache), mx.array(tables)))
    assert got.shape == (2, 2, 6, 2)
    for b in range(2):
        for h in range(2):
            expected = np.concatenate([cache[blk, h] for blk in tables[b]])
            np.testing.assert_array_equal(got[b, h], expected)
    # Row 0, head 1, position 4 = block 1 (second table entry), offset 1.
    np.testing.assert_array_equal(got[0, 1, 4], cache[1, 1, 1])


def test_gather_kv_keeps_dtype():
    cache = mx.ones((3, 1, 2, 4), dtype=mx.bfloat16)
    out = gather_kv(cache, mx.array([[2, 1, 0]], dtype=mx.int32))
    assert out.dtype == mx.bfloat16 and out.shape == (1, 1, 6, 4)


# ----------------------------------------------------------------------------- attention_mask


def test_attention_mask_hand_computed():
    # Row 0: a 3-token chunk at positions 2..4 (5 keys in the pool).
    # Row 1: one decode token at position 5 (6 keys), padded to 3 queries (positions 6, 7).
    query_start = mx.array([2, 5], dtype=mx.int32)
    context_lens = mx.array([5, 6], dtype=mx.int32)
    mask = attention_mask(query_start, 3, context_lens, 8)
    assert mask.shape == (2, 1, 3, 8) and mask.dtype == mx.bool_
    expected = np.array([
        [[1, 1, 1, 0, 0, 0, 0, 0],
         [1, 1, 1, 1, 0, 0, 0, 0],
         [1, 1, 1, 1, 1, 0, 0, 0]],
        [[1, 1, 1, 1, 1, 1, 0, 0],
         [1, 1, 1, 1, 1, 1, 0, 0],
         [1, 1, 1, 1, 1, 1, 0, 0]],
    ], bool)
    np.testing.assert_array_equal(np.array(mask)[:, 0], expected)


def test_attention_mask_sliding_window_hand_computed():
    query_start = mx.array([2, 5], dtype=mx.int32)
    context_lens = mx.array([5, 6], dtype=mx.int32)
    mask = attention_mask(query_start, 3, context_lens, 8, sliding_window=2)
    expected = np.array([
        [[0, 1, 1, 0, 0, 0, 0, 0],   # position 2 sees 1, 2
         [0, 0, 1, 1, 0, 0, 0, 0],   # position 3 sees 2, 3
         [0, 0, 0, 1, 1, 0, 0, 0]],  # position 4 sees 3, 4
        [[0, 0, 0, 0, 1, 1, 0, 0],   # position 5 sees 4, 5
         [0, 0, 0, 0, 0, 1, 0, 0],   # padded position 6: key 6 is past the context
         [0, 0, 0, 0, 0, 0, 0, 0]],  # padded position 7 sees nothing
    ], bool)
    np.testing.assert_array_equal(np.array(mask)[:, 0], expected)


def test_attention_mask_with_key_start_hand_computed():
    # Row 1's table starts at position 4 (key j is position 4 + j); row 0 starts at 0.
    mask = attention_mask(mx.array([2, 5], dtype=mx.int32), 3, mx.array([5, 6], dtype=mx.int32),
                          4, key_start=mx.array([0, 4], dtype=mx.int32), sliding_window=2)
    assert mask.shape == (2, 1, 3, 4)
    expected = np.array([
        [[0, 1, 1, 0], [0, 0, 1, 1], [0, 0, 0, 1]],
        [[1, 1, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]],
    ], bool)
    np.testing.assert_array_equal(np.array(mask)[:, 0], expected)
    no_window = attention_mask(mx.array([5], dtype=mx.int32), 1, mx.array([6], dtype=mx.int32),
                               4, key_start=mx.array([4], dtype=mx.int32))
    np.testing.assert_array_equal(np.array(no_window)[0, 0], [[1, 1, 0, 0]])


def test_attention_mask_single_decode_row():
    mask = attention_mask(mx.array([0], dtype=mx.int32), 1, mx.array([1], dtype=mx.int32), 4)
    np.testing.assert_array_equal(np.array(mask)[0, 0], [[1, 0, 0, 0]])


# ----------------------------------------------------------------------------- paged_attention


def test_decode_ragged_context_lengths(rng):
    rows = [(c - 1, 1) for c in (1, 15, 16, 17, 100)]
    case = make_case(rng, rows)
    assert case["block_tables"].shape == (5, 7)
    assert (case["block_tables"][0, 1:] == 0).all()  # short rows pad with the null block
    out = run(case, SCALE)
    assert out.dtype == mx.float32
    assert_matches(out, case, oracle(case, SCALE))


def test_prefill_chunks_over_cached_prefix(rng):
    # (query_start, chunk): a fresh prompt, a chunk after a block-aligned prefix, a chunk
    # starting mid-block, a decode row and a long chunk crossing several blocks.
    rows = [(0, 7), (16, 5), (3, 12), (30, 1), (21, 40)]
    case = make_case(rng, rows)
    assert_matches(run(case, SCALE), case, oracle(case, SCALE))


def test_prefill_from_zero_single_row(rng):
    case = make_case(rng, [(0, 33)], q_heads=2, kv_heads=2)
    assert_matches(run(case, 0.37), case, oracle(case, 0.37))


@pytest.mark.parametrize("group", [1, 4, 8])
def test_grouped_query_heads(rng, group):
    kv_heads = 2
    rows = [(0, 9), (15, 1), (16, 4), (70, 1)]
    case = make_case(rng, rows, q_heads=kv_heads * group, kv_heads=kv_heads)
    assert_matches(run(case, SCALE), case, oracle(case, SCALE))


def test_single_kv_head_many_query_heads(rng):
    case = make_case(rng, [(5, 3), (40, 1)], q_heads=8, kv_heads=1)
    assert_matches(run(case, SCALE), case, oracle(case, SCALE))


@pytest.mark.parametrize("window", [1, 5, 16, 33, 1000])
def test_sliding_window(rng, window):
    rows = [(0, 20), (16, 5), (30, 1), (99, 1), (3, 12)]
    case = make_case(rng, rows)
    ref = oracle(case, SCALE, sliding_window=window)
    out = run(case, SCALE, sliding_window=window)
    full = assert_matches(out, case, ref)
    # Trimming each table to the window (key_start > 0) gives the same valid outputs.
    tables, key_start = window_tables(case, window)
    assert tables.shape[1] <= case["block_tables"].shape[1]
    trimmed = assert_matches(run(case, SCALE, sliding_window=window, key_start=key_start,
                                 block_tables=tables), case, ref)
    for b, n in enumerate(case["num_new"]):
        np.testing.assert_allclose(trimmed[b, :, :n], full[b, :, :n], rtol=1e-6, atol=1e-6)


def test_window_tables_actually_trim(rng):
    case = make_case(rng, [(99, 1), (40, 8)])
    tables, key_start = window_tables(case, 5)
    assert key_start.tolist() == [80, 32]
    assert tables.shape == (2, 2)
    assert tables[0].tolist() == [case["tables"][0][5], case["tables"][0][6]]
    assert tables[1].tolist() == [case["tables"][1][2], 0]


def test_window_with_key_start_and_padded_rows(rng):
    # Chunk lengths differ by more than the window: the short row's padded queries may see no
    # key at all; their outputs must stay finite and the valid ones exact.
    rows = [(37, 1), (50, 20), (8, 3)]
    case = make_case(rng, rows, q_heads=4, kv_heads=1)
    tables, key_start = window_tables(case, 4)
    out = run(case, SCALE, sliding_window=4, key_start=key_start, block_tables=tables)
    assert_matches(out, case, oracle(case, SCALE, sliding_window=4))


def test_garbage_in_unused_and_null_blocks_does_not_matter(rng):
    rows = [(0, 1), (14, 3), (16, 1), (47, 2)]
    case = make_case(rng, rows, garbage=GARBAGE)
    ref = oracle(case, SCALE)
    got_garbage = assert_matches(run(case, SCALE), case, ref)
    # Same valid tokens, zeros everywhere else: identical valid outputs.
    clean = dict(case)
    for name in ("key_cache", "value_cache"):
        arr = np.zeros_like(case[name])
        for table, c in zip(case["tables"], case["context_lens"], strict=True):
            for pos in range(int(c)):
                blk, off = table[pos // BS], pos % BS
                arr[blk, :, off] = case[name][blk, :, off]
        clean[name] = arr
    assert np.abs(case["key_cache"][0]).min() >= 0.5 * GARBAGE  # the null block is garbage
    got_clean = assert_matches(run(clean, SCALE), clean, ref)
    for b, n in enumerate(case["num_new"]):
        np.testing.assert_allclose(got_garbage[b, :, :n], got_clean[b, :, :n], rtol=1e-6,
                                   atol=1e-7)


def test_padding_table_entries_may_point_anywhere(rng):
    # Entries past a row's last block are never read for valid keys, whatever they hold.
    case = make_case(rng, [(2, 1), (60, 1)])
    ref = oracle(case, SCALE)
    tables = case["block_tables"].copy()
    tables[0, 1:] = case["tables"][1][: tables.shape[1] - 1]  # another row's blocks
    assert_matches(run(case, SCALE, block_tables=tables), case, ref)


@pytest.mark.parametrize(("dtype", "np_dtype", "ulp"), [
    (mx.float16, np.float16, 2.0 ** -11),
    (mx.bfloat16, None, 2.0 ** -8),
])
def test_half_precision_inputs(rng, dtype, np_dtype, ulp):
    rows = [(0, 9), (15, 1), (16, 4), (99, 1), (30, 2)]
    case = make_case(rng, rows, garbage=3e4)
    out = run(case, SCALE, dtype=dtype)
    assert out.dtype == dtype
    if np_dtype is None:  # numpy has no bfloat16: round through mlx
        rounded = dict(case)
        for name in ("q", "key_cache", "value_cache"):
            rounded[name] = np.array(mx.array(case[name]).astype(dtype).astype(mx.float32))
        ref = oracle(rounded, SCALE)
    else:
        ref = oracle(case, SCALE, dtype=np_dtype)
    got = np.array(out.astype(mx.float32)).astype(np.float64)
    assert np.isfinite(got).all()
    err = np.concatenate([(got[b, :, :n] - ref[b]).ravel()
                          for b, n in enumerate(case["num_new"])])
    want = np.concatenate([r.ravel() for r in ref])
    # Relative error over the whole output within 2e-3; each element within the dtype's
    # final rounding (half an ulp, relative) plus float32 arithmetic.
    assert np.linalg.norm(err) <= 2e-3 * np.linalg.norm(want)
    assert (np.abs(err) <= ulp * np.abs(want) + 1e-4).all()


def test_output_shape_and_scale_matter(rng):
    case = make_case(rng, [(10, 2), (3, 1)])
    a = np.array(run(case, SCALE))
    b = np.array(run(case, 2 * SCALE))
    assert a.shape == (2, 4, 2, D)
    assert not np.allclose(a[0, :, :2], b[0, :, :2])
    assert_matches(run(case, 2 * SCALE), case, oracle(case, 2 * SCALE))
