"""Cascade attention (a shared prefix once per group, each row's own keys apart, merged by
their log-sum-exp) in the reference and the CPU kernel, against a float64 numpy computation of
plain attention over each row's whole context.

Cases: decode rows and prefill chunks (several queries a row, over a prefix cached before
the step; shorter chunks padded), groups of 2 to 128 rows, several groups of different
prefix lengths beside rows in no group, own parts of 1 key up to several blocks (a member's
query may sit anywhere in its own blocks), sliding windows that reach into the prefix for
some members only (members at different positions), attention sinks (counted once),
quantized pools (int8, int4, k8v4: the oracle reads their dequantized values), GQA ratios 1,
4 and 8. The cascade inputs come from the runner's builder
(``mlxpa.worker.cascade.cascade_tables``) with every group kept.
Every pool entry no row owns holds large values, so a key read outside a row's context shows.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from mlxpa.kernels import PagedKV, cascade_reference, cpu_paged_attention
from mlxpa.kernels.quant import dense, quantize
from mlxpa.worker.cascade import cascade_tables

IMPLS = {"reference": cascade_reference.cascade_attention,
         "cpu": cpu_paged_attention.cascade_attention}
GARBAGE = 30.0  # large enough that one leaked key changes the result, finite when quantized


def _always(rows: int, blocks: int) -> bool:
    return True


def make_case(rng, groups: list[tuple[int, list[int]]], singles: list[int], *, kv_heads=1,
              q_per_kv=4, head_dim=32, block_size=16, window=None, quant=None, v_dim=None,
              length=1):
    """Rows of ``groups`` (``(prefix_blocks, own lengths of its members)``) then ``singles``
    (own lengths of rows in no group); a row's queries are its last ``min(length, own
    length)`` keys (a prefill chunk after its cached prefix; ``length == 1``: a decode row),
    right-padded to ``length``."""
    bs = block_size
    dv = v_dim or head_dim
    rows = [(g, n) for g, (_, owns) in enumerate(groups) for n in owns] + [
        (None, n) for n in singles]
    count = sum(p for p, _ in groups) + sum(math.ceil(n / bs) for _, n in rows) + 3
    ids = iter(rng.permutation(np.arange(1, count + 1)).tolist())
    prefix_ids = [[next(ids) for _ in range(p)] for p, _ in groups]
    tables, ctx = [], []
    for g, n in rows:
        shared = prefix_ids[g] if g is not None else []
        tables.append(shared + [next(ids) for _ in range(math.ceil(n / bs))])
        ctx.append(len(shared) * bs + n)
    shape = (count + 1, kv_heads, bs)
    kpool = GARBAGE * rng.uniform(-1, 1, (*shape, head_dim))
    vpool = GARBAGE * rng.uniform(-1, 1, (*shape, dv))
    for table, c in zip(tables, ctx):
        for pos in range(c):
            kpool[table[pos // bs], :, pos % bs] = rng.standard_normal((kv_heads, head_dim))
            vpool[table[pos // bs], :, pos % bs] = rng.standard_normal((kv_heads, dv))
    kc, vc = mx.array(kpool.astype(np.float32)), mx.array(vpool.astype(np.float32))
    if quant is not None:
        kc, vc = quantize(kc, quant[0], quant[2]), quantize(vc, quant[1], quant[2])
    width = max(map(len, tables))
    full = np.zeros((len(rows), width), np.int32)
    for r, t in enumerate(tables):
        full[r, :len(t)] = t
    counts = [min(length, n) for _, n in rows]
    starts = np.array(ctx, np.int32) - np.array(counts, np.int32)
    members = [[r for r, (g, _) in enumerate(rows) if g == k] for k in range(len(groups))]
    cascade = cascade_tables([(m, p) for m, (p, _) in zip(members, groups)], starts, full,
                             np.array([len(t) for t in tables]), bs, window, _always)
    q = rng.standard_normal((len(rows), kv_heads * q_per_kv, length, head_dim))
    return {"q": q, "kc": kc, "vc": vc, "tables": tables, "full": full, "ctx": ctx,
            "starts": starts, "counts": counts, "cascade": cascade, "window": window,
            "bs": bs}


def oracle(case, scale, sinks=None) -> np.ndarray:
    """Plain causal attention of each row's queries over its whole context, float64:
    ``[B, H, L, Dv]`` (padding queries: 0)."""
    kc = np.array(dense(case["kc"]).astype(mx.float32), np.float64)
    vc = np.array(dense(case["vc"]).astype(mx.float32), np.float64)
    q, bs, window = case["q"], case["bs"], case["window"]
    heads, group = q.shape[1], q.shape[1] // kc.shape[1]
    out = np.zeros((*q.shape[:3], vc.shape[-1]))
    for r, (table, start, n) in enumerate(zip(case["tables"], case["starts"],
                                              case["counts"])):
        for i in range(n):
            pos = np.arange(start + i + 1)
            visible = pos > start + i - window if window else pos >= 0
            blocks = np.array(table)[pos // bs]
            k = kc[blocks, :, pos % bs][visible]                         # [n, kvh, D]
            v = vc[blocks, :, pos % bs][visible]
            for h in range(heads):
                s = k[:, h // group] @ q[r, h, i] * scale
                terms = np.append(s, sinks[h]) if sinks is not None else s
                w = np.exp(s - terms.max())
                out[r, h, i] = w @ v[:, h // group] / np.exp(terms - terms.max()).sum()
    return out


def run(impl, case, scale, sinks=None, dtype=mx.float32) -> np.ndarray:
    c = case["cascade"]
    kv = PagedKV(case["kc"], case["vc"], c.block_tables,
                 mx.array(np.array(case["ctx"], np.int32)), mx.array(case["starts"]), scale,
                 sliding_window=case["window"], key_start=c.key_start,
                 sinks=None if sinks is None else mx.array(sinks.astype(np.float32)))
    out = IMPLS[impl](mx.array(case["q"]).astype(dtype), kv, c.prefix)
    assert out.dtype == dtype and out.shape == (*case["q"].shape[:3], case["vc"].shape[-1])
    got = np.array(out.astype(mx.float32))
    for r, n in enumerate(case["counts"]):
        got[r, :, n:] = 0      # padding queries: no one reads them
    return got


@pytest.fixture(params=sorted(IMPLS))
def impl(request):
    return request.param


@pytest.mark.parametrize("size", [2, 3, 17, 128])
def test_one_group_of_many_sizes(impl, size):
    rng = np.random.default_rng(size)
    owns = rng.integers(1, 40, size).tolist()
    case = make_case(rng, [(5, owns)], [])
    assert case["cascade"].prefix.rows.shape == (1, size)
    np.testing.assert_allclose(run(impl, case, 0.2), oracle(case, 0.2), atol=1e-5)


@pytest.mark.parametrize("kv_heads,q_per_kv", [(2, 4), (4, 1), (1, 8)])
def test_groups_of_different_prefixes_and_rows_in_no_group(impl, kv_heads, q_per_kv):
    rng = np.random.default_rng(kv_heads * 10 + q_per_kv)
    # Own parts of 1 key, a block less one, a block, a block and one, several blocks.
    case = make_case(rng, [(3, [1, 15, 16]), (1, [17, 40]), (7, [2, 33, 5, 1])], [9, 70, 1],
                     kv_heads=kv_heads, q_per_kv=q_per_kv)
    p = case["cascade"].prefix
    assert np.array(p.prefix_end).tolist() == [48, 16, 112]
    assert np.array(p.row_slot).tolist()[-3:] == [3 * 4] * 3   # rows in no group
    np.testing.assert_allclose(run(impl, case, 0.3), oracle(case, 0.3), atol=1e-5)


@pytest.mark.parametrize("window", [5, 16, 21, 40, 200])
def test_sliding_window_masks_each_members_part_of_the_prefix(impl, window):
    rng = np.random.default_rng(window)
    # Members at different positions: 4 prefix blocks (64 keys), own parts 1..35 keys.
    case = make_case(rng, [(4, [1, 3, 12, 17, 35]), (2, [20, 30])], [4], window=window)
    np.testing.assert_allclose(run(impl, case, 0.25), oracle(case, 0.25), atol=1e-5)


def test_window_inside_own_keys_leaves_the_group():
    # A 5-key window never reaches the 64 shared keys of members 20 keys past them: no group
    # pays, the builder gives nothing (the layer keeps plain paged attention).
    rng = np.random.default_rng(0)
    case = make_case(rng, [(4, [20, 21, 22])], [], window=5)
    assert case["cascade"] is None


def test_window_keeps_only_members_that_reach_the_prefix():
    rng = np.random.default_rng(1)
    case = make_case(rng, [(4, [2, 3, 30])], [], window=8)
    p = case["cascade"].prefix
    # Member 2 (30 own keys) sees none of the prefix through an 8-key window: left out.
    assert np.array(p.rows).tolist() == [[0, 1]]
    assert np.array(p.key_start).tolist() == [48]      # the earliest window's block
    assert np.array(case["cascade"].key_start).tolist() == [64, 64, 80]


@pytest.mark.parametrize("length", [2, 16, 37])
@pytest.mark.parametrize("window", [None, 21])
def test_prefill_chunks_over_a_cached_prefix(impl, length, window):
    """Prefill chunks (``L`` queries a row, shorter chunks padded) whose group's prefix was
    cached before the step: each query is causal over its row's own keys and sees the
    prefix through its own window."""
    rng = np.random.default_rng(length * 7 + (window or 0))
    case = make_case(rng, [(4, [1, 15, 40, 37]), (2, [16, 60])], [9, 45], kv_heads=2,
                     q_per_kv=2, window=window, length=length)
    assert case["cascade"] is not None
    np.testing.assert_allclose(run(impl, case, 0.25), oracle(case, 0.25), atol=1e-5)


def test_prefill_chunks_of_one_large_group_in_tiles(monkeypatch):
    """The CPU kernel splits a prefill group's stacked queries into tiles (both streams):
    tiles of 1, 3 and all slots give the oracle's values."""
    rng = np.random.default_rng(11)
    case = make_case(rng, [(3, [12, 7, 12, 12, 3, 12, 12])], [], length=12, window=30)
    want = oracle(case, 0.3)
    for tile in (1, 12 * 4 * 3, 12 * 4 * 7):
        monkeypatch.setattr(cpu_paged_attention, "PREFIX_TILE", tile)
        np.testing.assert_allclose(run("cpu", case, 0.3), want, atol=1e-5)


@pytest.mark.parametrize("length", [1, 6])
def test_sinks_count_once(impl, length):
    rng = np.random.default_rng(3)
    case = make_case(rng, [(3, [1, 9, 20])], [5], kv_heads=2, q_per_kv=2, length=length)
    sinks = rng.standard_normal(4) * 2
    want = oracle(case, 0.3, sinks)
    np.testing.assert_allclose(run(impl, case, 0.3, sinks), want, atol=1e-5)
    assert np.abs(oracle(case, 0.3) - want).max() > 1e-2      # the sink matters here


@pytest.mark.parametrize("quant", [(8, 8, 32), (4, 4, 32), (8, 4, 32)],
                         ids=["int8", "int4", "k8v4"])
@pytest.mark.parametrize("length", [1, 5])
def test_quantized_pools(impl, quant, length):
    rng = np.random.default_rng(sum(quant))
    case = make_case(rng, [(4, [1, 17, 30]), (2, [3, 3])], [12], kv_heads=2, window=50,
                     quant=quant, length=length)
    np.testing.assert_allclose(run(impl, case, 0.2), oracle(case, 0.2), atol=1e-5)


def test_value_width_differs_from_key_width(impl):
    rng = np.random.default_rng(4)
    case = make_case(rng, [(2, [1, 5])], [3], v_dim=16)
    np.testing.assert_allclose(run(impl, case, 0.3), oracle(case, 0.3), atol=1e-5)


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
def test_half_precision_queries(impl, dtype):
    rng = np.random.default_rng(5)
    case = make_case(rng, [(3, [1, 9, 20])], [5])
    want = oracle(case, 0.3)
    np.testing.assert_allclose(run(impl, case, 0.3, dtype=dtype), want, atol=3e-2)


def test_merge_states_of_two_halves_is_the_whole():
    rng = np.random.default_rng(6)
    s = rng.standard_normal((3, 2, 10))
    v = rng.standard_normal((3, 2, 10, 5))
    sinks = rng.standard_normal(2)

    def part(lo, hi):
        x = s[..., lo:hi]
        lse = np.log(np.exp(x).sum(-1))
        return np.einsum("bhk,bhkd->bhd", np.exp(x - lse[..., None]), v[..., lo:hi, :]), lse

    f32 = lambda a: mx.array(a.astype(np.float32))  # noqa: E731
    (oa, la), (ob, lb) = part(0, 4), part(4, 10)
    got = cascade_reference.merge_states(f32(oa), f32(la), f32(ob), f32(lb), f32(sinks))
    e = np.exp(s)
    want = np.einsum("bhk,bhkd->bhd", e, v) / (e.sum(-1) + np.exp(sinks))[..., None]
    np.testing.assert_allclose(np.array(got), want, atol=1e-5)
    # A part that saw nothing (-inf) drops out; neither part: zeros, not NaN.
    empty = mx.full((3, 2), -mx.inf)
    np.testing.assert_allclose(np.array(cascade_reference.merge_states(f32(oa), f32(la), f32(ob),
                                                               empty)), oa, atol=1e-6)
    assert np.all(np.array(cascade_reference.merge_states(f32(oa), empty, f32(ob), empty)) == 0)


def test_lse_part_matches_float64(impl):
    """The own-keys part alone: output and log-sum-exp from a key offset."""
    rng = np.random.default_rng(7)
    case = make_case(rng, [(3, [1, 9, 20])], [5, 33], kv_heads=2)
    c = case["cascade"]
    kv = PagedKV(case["kc"], case["vc"], c.block_tables,
                 mx.array(np.array(case["ctx"], np.int32)), mx.array(case["starts"]), 0.3,
                 key_start=c.key_start)
    out, lse = cascade_reference.paged_attention_lse(mx.array(case["q"]).astype(mx.float32), kv)
    kc, vc = (np.array(dense(x), np.float64) for x in (case["kc"], case["vc"]))
    starts = np.array(c.key_start)
    for r, (table, n) in enumerate(zip(case["tables"], case["ctx"])):
        pos = np.arange(starts[r], n)
        blocks = np.array(table)[pos // 16]
        for h in range(8):
            s = kc[blocks, h // 4, pos % 16] @ case["q"][r, h, 0] * 0.3
            want = np.log(np.exp(s).sum())
            assert abs(float(lse[r, h, 0]) - want) < 1e-4
            w = np.exp(s - want) @ vc[blocks, h // 4, pos % 16]
            np.testing.assert_allclose(np.array(out[r, h, 0]), w, atol=1e-5)
