"""Quantized KV pools (``--kv-cache-dtype``): the bytes of the pool arrays, writes that store
exactly what mlx-lm's ``QuantizedKVCache`` stores, full blocks never rewritten, block copies
with their scales and biases, donatable writes, the per-entry policy and its KV pool line, and
the load check catching a broken quantized path."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import QuantizedKVCache

from mlxpa.config import EngineConfig
from mlxpa.kernels.quant import QuantizedPool
from mlxpa.loader.errors import UnsupportedModelError
from mlxpa.request import Request
from mlxpa.sampling_params import SamplingParams
from mlxpa.worker.kv_cache import PagedKVCache, PoolSpec, block_bytes
from mlxpa.worker.kv_storage import kv_storage
from mlxpa.worker.model_probe import CacheGeometry, ModelGeometry
from mlxpa.worker.model_runner import ModelRunner
from tests.tiny_models import tiny_llama

DTYPES = ("auto", "int8", "int4", "k8v4")


@pytest.fixture(scope="module")
def bf16_runners():
    """A bfloat16 tiny llama (2 layers, 2 KV heads of 64) with a 9-block pool per dtype."""
    model = tiny_llama(hidden=256)
    model.set_dtype(mx.bfloat16)
    runners = {d: ModelRunner(model, EngineConfig(num_blocks=9, kv_cache_dtype=d)) for d in DTYPES}
    for r in runners.values():
        r.allocate_kv_cache(r.budget_blocks)
    return runners


def test_bytes_per_token_from_the_pool_arrays(bf16_runners):
    """Counted from ``.nbytes`` of every pool array: int8 stores a token in >= 1.8x fewer
    bytes than bfloat16, int4 in >= 3.5x fewer. Hand count per layer and token (2 heads of 64,
    groups of 64, bfloat16 scales and biases): bfloat16 2 * 2 * 64 * 2 = 512; int8
    2 * 2 * (64 + 2 * 2) = 272; int4 2 * 2 * (32 + 4) = 144; k8v4 2 * (68 + 36) = 208."""
    per_token = {}
    for d, r in bf16_runners.items():
        tokens = r.num_blocks * r.block_size
        per_token[d] = r.kv_cache.nbytes / tokens
        assert per_token[d] == r.block_bytes / r.block_size  # the sizing counts the layout
    assert per_token == {"auto": 1024, "int8": 544, "int4": 288, "k8v4": 416}
    assert per_token["auto"] / per_token["int8"] >= 1.8
    assert per_token["auto"] / per_token["int4"] >= 3.5


def test_kv_memory_buys_proportionally_more_blocks():
    model = tiny_llama(hidden=256)
    budget = {d: ModelRunner(model, EngineConfig(kv_cache_memory_bytes=2**30 // 100,
                                                 kv_cache_dtype=d)).budget_blocks
              for d in ("auto", "int8", "int4")}
    # float32 model: 2048 bytes per token in auto, 576 in int8, 320 in int4.
    assert budget == {d: int(0.01 * 2**30) // (16 * b) + 1
                      for d, b in (("auto", 2048), ("int8", 576), ("int4", 320))}


def test_write_stores_what_mlx_lm_quantized_cache_stores():
    """Two requests' tokens scattered into shuffled blocks: each token's packed words,
    scales and biases are bit-identical to mlx-lm's ``QuantizedKVCache`` of the same K/V."""
    kv = PagedKVCache([PoolSpec(2, 64, 128, 8, 4, 64)], 8, 4, mx.float32)
    keys = mx.random.normal((2, 2, 6, 64), key=mx.random.key(0))
    values = mx.random.normal((2, 2, 6, 128), key=mx.random.key(1))
    tables = [[5, 2], [3, 7]]
    slots = np.array([tables[b][t // 4] * 4 + t % 4 for b in range(2) for t in range(6)])
    kv.write(0, keys, values, mx.array(slots // 4, mx.int32), mx.array(slots % 4, mx.int32))
    for b in range(2):
        for pool, new, bits in ((kv.key_caches[0], keys, 8), (kv.value_caches[0], values, 4)):
            ref = QuantizedKVCache(group_size=64, bits=bits)
            stored, _ = ref.update_and_fetch(new[b:b + 1], new[b:b + 1])
            for got, want in zip(pool.arrays, stored):
                rows = mx.concatenate([got[blk] for blk in tables[b]], axis=1)[:, :6]
                assert mx.array_equal(rows, want[0]), (b, bits)


def _snapshot(kv: PagedKVCache, block: int) -> list[np.ndarray]:
    return [np.array(a[block]) for a in kv.arrays()]


def test_full_block_is_never_rewritten_and_copies_carry_scales():
    kv = PagedKVCache([PoolSpec(1, 64, 64, 4, 4, 32)], 6, 4, mx.float32)
    k = mx.random.normal((1, 1, 4, 64), key=mx.random.key(2))
    kv.write(0, k, -k, mx.array([3] * 4, mx.int32), mx.arange(4, dtype=mx.int32))
    mx.eval(kv.arrays())
    full = _snapshot(kv, 3)
    assert any(np.any(a != 0) for a in full)
    # The next token goes to block 4; block 3 keeps its bytes.
    kv.write(0, k[:, :, :1] * 3, k[:, :, :1], mx.array([4], mx.int32), mx.array([0], mx.int32))
    mx.eval(kv.arrays())
    assert all(np.array_equal(a, b) for a, b in zip(full, _snapshot(kv, 3)))
    # Copy-on-write: block 4 into 1 and 3 into 5; every array (packed, scales, biases).
    kv.copy_blocks([(4, 1), (3, 5)])
    assert all(np.array_equal(a, b) for a, b in zip(_snapshot(kv, 4), _snapshot(kv, 1)))
    assert all(np.array_equal(a, b) for a, b in zip(full, _snapshot(kv, 5)))
    assert isinstance(kv.key_caches[0], QuantizedPool) and len(kv.arrays()) == 6


@pytest.mark.parametrize("spec", [PoolSpec(2, 128, 128), PoolSpec(2, 128, 128, 8, 4, 64)],
                         ids=["float", "k8v4"])
def test_writes_keep_the_pool_donatable(spec):
    """A write plus its evaluation allocates no copy of the pool (MLX donates the buffer);
    a live view of the old buffer (what DESIGN forbids) makes it copy the whole array, so
    the measurement can see a copy."""
    kv = PagedKVCache([spec], 4096, 16, mx.float32)
    k = mx.random.normal((3, 2, 5, 128), key=mx.random.key(3))
    blocks, offsets = mx.array([7] * 15, mx.int32), mx.arange(15, dtype=mx.int32) % 16
    biggest = max(a.nbytes for a in kv.arrays())

    def extra_peak():
        mx.synchronize()
        mx.reset_peak_memory()
        base = mx.get_active_memory()
        kv.write(0, k, k, blocks, offsets)
        mx.eval(kv.arrays())
        return mx.get_peak_memory() - base

    extra_peak()
    assert extra_peak() < biggest / 50
    view = kv.arrays()[0].reshape(-1)
    mx.eval(view)
    assert extra_peak() >= biggest


def _geometry(*caches: CacheGeometry) -> ModelGeometry:
    return ModelGeometry("test", list(caches), mx.bfloat16)


def test_policy_keeps_what_it_cannot_quantize_and_says_why():
    g = _geometry(CacheGeometry(2, 128, 128), CacheGeometry(1, 80, 80, window=512),
                  CacheGeometry(1, 64, 64, gathered=True), CacheGeometry(0, 0, 0, state_size=2),
                  CacheGeometry(4, 64, 64, window=8))
    s = kv_storage(g, "k8v4", 64)
    assert [tuple(p) for p in s.specs] == [(2, 128, 128, 8, 4, 64), (1, 80, 80, 0, 0, 64),
                                           (1, 64, 64, 0, 0, 64), (0, 0, 0, 0, 0, 64),
                                           (4, 64, 64, 8, 4, 64)]
    # Per token: 2 heads * ((128 + 2 groups * 2 * 2) + (64 + 8)) + 160 * 2 + 128 * 2
    # + 4 heads * ((64 + 4) + (32 + 4)).
    assert s.token_bytes == 416 + 320 + 256 + 416
    assert s.block_bytes(16) == 16 * s.token_bytes == block_bytes(s.specs, 16, mx.bfloat16)
    assert s.describe() == (
        "k8v4 (8-bit K, 4-bit V, group 64, scales bfloat16), 1,408 bytes per token; "
        "cache 1 kept in bfloat16: head width 80/80 is not a multiple of the group size 64 "
        "(--kv-group-size); cache 2 kept in bfloat16: its layer computes K/V from the cached "
        "latent (latent attention, MLA), which the quantized path cannot run exactly; "
        "recurrent state in bfloat16 (1 entry, no pool)")
    auto = kv_storage(g)
    assert auto.describe().startswith("bfloat16, ") and not auto.kept
    assert all(p.k_bits == 0 for p in auto.specs)
    nothing = kv_storage(_geometry(CacheGeometry(1, 16, 16)), "int8", 32)
    assert nothing.describe().startswith("bfloat16 (int8 applies to no cache), 64 bytes")
    with pytest.raises(ValueError, match="kv_cache_dtype must be"):
        kv_storage(g, "fp8")


@pytest.mark.parametrize("bug", ["lost-bias", "next-slot"])
def test_load_check_refuses_a_broken_quantized_path(monkeypatch, bug):
    """A write that drops the biases, or stores each token one slot later in its block: the
    stored rows are far from mlx-lm's own K/V, so the model is refused at load, not run
    wrong."""
    from mlxpa.kernels import quant

    real_quantize, real_write = quant.quantize, PagedKVCache.write

    def no_bias(x, bits, group_size):
        q = real_quantize(x, bits, group_size)
        return q._replace(biases=mx.zeros_like(q.biases))

    def next_slot(self, layer, keys, values, blocks, offsets):
        real_write(self, layer, keys, values, blocks, (offsets + 1) % self.block_size)

    model = tiny_llama(hidden=256)
    ModelRunner(model, EngineConfig(num_blocks=9, kv_cache_dtype="int4"))  # passes
    if bug == "lost-bias":
        monkeypatch.setattr(quant, "quantize", no_bias)
    else:
        monkeypatch.setattr(PagedKVCache, "write", next_slot)
    with pytest.raises(UnsupportedModelError, match="the quantized write is wrong"):
        ModelRunner(model, EngineConfig(num_blocks=9, kv_cache_dtype="int4"))


def test_config_fields_are_validated():
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, int8, int4, k8v4"):
        EngineConfig(kv_cache_dtype="fp8")
    for bad in (48, 64.0, True):
        with pytest.raises(ValueError, match="kv_group_size must be one of 32, 64, 128"):
            EngineConfig(kv_group_size=bad)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
@pytest.mark.parametrize("kernel", ["reference", "cpu"])
def test_non_finite_kv_of_one_request_does_not_reach_another(dtype, kernel):
    """A request whose K/V were NaN/inf (an overflowing model; float16: a value past its
    range) wrote every slot of block 3, and a padding token wrote NaN into the null block.
    Block 3 then goes to another request, which fills 2 of its slots; its table is padded
    with the null block. Its decode output equals a float64 oracle over its own 6 tokens
    (stored non-finite values would give NaN through ``0 * NaN``)."""
    from mlxpa.kernels import PagedKV, cpu_paged_attention, reference

    kv = PagedKVCache([(1, 8, 8)], 5, 4, dtype)
    bad = mx.array([np.nan, np.inf, -np.inf, 1e6])[None, None, :, None] * mx.ones((1, 1, 4, 8))
    kv.write(0, bad, bad, mx.array([3] * 4, mx.int32), mx.arange(4, dtype=mx.int32))
    kv.write(0, bad[:, :, :1], bad[:, :, :1], mx.array([0], mx.int32),
             mx.array([0], mx.int32))
    rng = np.random.default_rng(0)
    k, v, q = (rng.standard_normal(s).astype(np.float32) for s in ((6, 8), (6, 8), (1, 2, 1, 8)))
    slots = [2 * 4 + t for t in range(4)] + [3 * 4 + t for t in range(2)]
    kv.write(0, mx.array(k[None, None]), mx.array(v[None, None]),
             mx.array([s // 4 for s in slots], mx.int32),
             mx.array([s % 4 for s in slots], mx.int32))
    paged = PagedKV(kv.key_caches[0], kv.value_caches[0], mx.array([[2, 3, 0]], mx.int32),
                    mx.array([6], mx.int32), mx.array([5], mx.int32), 8 ** -0.5)
    attend = cpu_paged_attention if kernel == "cpu" else reference
    out = np.array(attend.paged_attention(mx.array(q, dtype), paged).astype(mx.float32))
    kq, vq, qq = (np.array(mx.array(a, dtype).astype(mx.float32), np.float64) for a in (k, v, q))
    for h in range(2):
        s = kq @ qq[0, h, 0] * 8 ** -0.5
        p = np.exp(s - s.max())
        want = (p / p.sum()) @ vq
        np.testing.assert_allclose(out[0, h, 0], want, rtol=0, atol=5e-3 if dtype ==
                                   mx.float16 else 1e-5)


@pytest.mark.parametrize("kernel", ["reference", "cpu"])
def test_non_finite_kv_stays_out_of_a_quantized_pool(kernel):
    """The same with an 8-bit pool: a NaN/inf token quantized would give its block's group
    NaN scales; stored as 0, the next owner's decode stays within 8-bit rounding of the
    float64 oracle."""
    from mlxpa.kernels import PagedKV, cpu_paged_attention, reference

    d = 64
    kv = PagedKVCache([PoolSpec(1, d, d, 8, 8, 64)], 5, 4, mx.float32)
    bad = mx.array([np.nan, np.inf, -np.inf, 1.0])[None, None, :, None] * mx.ones((1, 1, 4, d))
    kv.write(0, bad, bad, mx.array([3] * 4, mx.int32), mx.arange(4, dtype=mx.int32))
    rng = np.random.default_rng(1)
    k, v, q = (rng.standard_normal(s).astype(np.float32) for s in ((2, d), (2, d), (1, 2, 1, d)))
    kv.write(0, mx.array(k[None, None]), mx.array(v[None, None]), mx.array([3, 3], mx.int32),
             mx.array([0, 1], mx.int32))
    paged = PagedKV(kv.key_caches[0], kv.value_caches[0], mx.array([[3, 0]], mx.int32),
                    mx.array([2], mx.int32), mx.array([1], mx.int32), d ** -0.5)
    attend = cpu_paged_attention if kernel == "cpu" else reference
    out = np.array(attend.paged_attention(mx.array(q), paged))
    for h in range(2):
        s = k.astype(np.float64) @ q[0, h, 0] * d ** -0.5
        p = np.exp(s - s.max())
        np.testing.assert_allclose(out[0, h, 0], (p / p.sum()) @ v, rtol=0, atol=0.05)


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("kernel", ["reference", "cpu"])
def test_snapshot_bytes_are_cleared_before_a_block_holds_kv(dtype, kernel):
    """A recurrent snapshot's raw bytes (a finite float32 state) in block 3 read as a
    half-precision pool hold NaN/inf. The block freed and given to a decode row as its last
    K/V block, the runner's ``clear_raw`` of the step's written blocks zeroes it first, so
    the slots past the row's context hold 0 and its output equals the float64 oracle (a
    second, longer row makes the CPU kernel read those slots)."""
    from mlxpa.kernels import PagedKV, cpu_paged_attention, reference
    from mlxpa.worker.block_tables import written_blocks

    h, d, bs = 2, 64, 16
    kv = PagedKVCache([(h, d, d)], 8, bs, dtype)
    rng = np.random.default_rng(0)
    state = rng.standard_normal(kv.block_nbytes // 4).astype(np.float32)
    kv.write_bytes([3], mx.array(state.view(np.uint8)))
    mx.eval(kv.arrays())
    assert not np.isfinite(np.array(kv.value_caches[0][3].astype(mx.float32))).all()
    assert kv.raw_blocks == {3}
    tables, lens = [[2, 3, 0], [1, 4, 5]], [bs + 2, 2 * bs + 8]
    reqs = [Request(str(i), list(range(n)), SamplingParams()) for i, n in enumerate(lens)]
    for req, table in zip(reqs, tables):
        req.block_tables = [table]
    kv.clear_raw(written_blocks(reqs, lens, bs))   # each row's whole prompt this step
    assert kv.raw_blocks == set()
    kvs, qs = [], rng.standard_normal((2, h, 1, d)).astype(np.float32)
    for table, n in zip(tables, lens):
        k, v = (rng.standard_normal((1, h, n, d)).astype(np.float32) for _ in range(2))
        slots = [table[t // bs] * bs + t % bs for t in range(n)]
        kv.write(0, mx.array(k), mx.array(v), mx.array([s // bs for s in slots], mx.int32),
                 mx.array([s % bs for s in slots], mx.int32))
        kvs.append((k, v))
    paged = PagedKV(kv.key_caches[0], kv.value_caches[0], mx.array(tables, mx.int32),
                    mx.array(lens, mx.int32), mx.array([n - 1 for n in lens], mx.int32),
                    d ** -0.5)
    attend = cpu_paged_attention if kernel == "cpu" else reference
    out = np.array(attend.paged_attention(mx.array(qs, dtype), paged).astype(mx.float32))
    for r, (k, v) in enumerate(kvs):
        kq, vq, qq = (np.array(mx.array(a, dtype).astype(mx.float32), np.float64)
                      for a in (k, v, qs))
        for head in range(h):
            s = kq[0, head] @ qq[r, head, 0] * d ** -0.5
            p = np.exp(s - s.max())
            np.testing.assert_allclose(out[r, head, 0], (p / p.sum()) @ vq[0, head],
                                       rtol=0, atol=2e-2)


def test_written_blocks_and_raw_block_bookkeeping():
    """By hand: the blocks a step writes (every group, from num_computed_tokens on, drafts
    counted); copies carry rawness to their destination, a shrink forgets blocks past it."""
    from mlxpa.worker.block_tables import written_blocks

    req = Request("a", list(range(40)), SamplingParams())
    req.block_tables = [[5, 6, 7], [0, 9, 8]]   # a window group already dropped its first
    req.num_computed_tokens = 20
    assert written_blocks([req], [13], 16) == {6, 7, 9, 8}   # tokens 20..32
    assert written_blocks([req], [1], 16) == {6, 9}
    kv = PagedKVCache([(1, 8, 8)], 8, 4, mx.float32)
    kv.write_bytes([2, 6], mx.zeros(2 * kv.block_nbytes, mx.uint8))
    kv.copy_blocks([(2, 3), (1, 6)])
    assert kv.raw_blocks == {2, 3}
    kv.resize(3)
    assert kv.raw_blocks == {2}
