"""The batched sampler's filters and draw (:mod:`mlxpa.worker.topk_topp_sampler`).

Oracles: a float64 numpy reference of the definitions (temperature, min-p, top-k, top-p in
vLLM's order, ties kept together) on hand-made and random logits; the row sampled alone (its
neighbours must not change it); numpy's argmax; a chi-square test of the draws against the
reference's probabilities; scipy's Kolmogorov-Smirnov test of the noise's uniforms."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from mlxpa.sampling_params import SamplingParams
from mlxpa.worker.topk_topp_sampler import (
    SamplingMetadata,
    draw,
    gumbel_noise,
    kept_threshold,
    request_key,
    sample_one,
)

VOCAB = 50
# (block, candidates): the default (whole-row decisions at this vocabulary) and small blocks,
# which decide most rows on candidates and fall back to 64 times as many or the whole row
LAYOUTS = [(256, 64), (2, 4), (3, 6), (4, 8), (1, 2), (2, 1)]


def logits(seed: int, rows: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, VOCAB)).astype(np.float32)


def meta(params: list[SamplingParams], seeds: list[int], positions: list[int]):
    return SamplingMetadata.of(params, seeds, positions)


def reference_kept(x: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The tokens the filters keep, in float64 from their definitions: min-p keeps
    ``softmax(x/T) >= min_p * max`` (compared as logs), top-k the tokens at least as large as
    the k-th largest, top-p the tokens whose strictly larger kept tokens hold less than
    ``top_p`` of the kept mass; masked (-inf) tokens never."""
    x = x.astype(np.float64)
    finite = np.isfinite(x)
    z = np.where(finite, (x - x[finite].max()) / p.temperature, -np.inf)
    keep = finite.copy()
    if p.min_p > 0:
        keep &= z >= np.log(p.min_p)
    if 0 < p.top_k < len(x):
        keep &= x >= np.sort(x)[::-1][p.top_k - 1]
    if p.top_p < 1:
        w = np.where(keep, np.exp(z), 0.0)
        larger = np.array([w[x > x[t]].sum() for t in range(len(x))])
        keep &= larger < p.top_p * w.sum()
    return keep


HAND_MADE = [
    np.array([3, 1, 3, 2, 2, 2, 0, -np.inf, 1, 2], np.float32),  # ties at every level
    np.array([5, 5, 5, 5, 5, 5, 5, 5], np.float32),  # all equal
    np.array([-np.inf, 0.5, -np.inf, -np.inf, 0.25, 7, -np.inf, 7], np.float32),  # masked
    np.array([10, 9.9, 9.8, -3, -3, -3, -3, -3, -3, -3, -3, -3], np.float32),
    np.linspace(-5, 5, 64, dtype=np.float32),
]
FILTERS = [
    SamplingParams(temperature=1.0, top_k=2),
    SamplingParams(temperature=1.0, top_k=3),  # the 3rd largest ties with others: all kept
    SamplingParams(temperature=0.7, top_k=1000),  # top_k >= vocab: off
    SamplingParams(temperature=0.7, top_k=2**70),  # past int64 (it stopped a server): off
    SamplingParams(temperature=1.0, top_p=1e-300),  # only the largest (and its ties)
    SamplingParams(temperature=0.8, top_p=0.9, top_k=50),
    SamplingParams(temperature=2.0, top_p=0.5),
    SamplingParams(temperature=1.0, min_p=1.0),  # only the largest (and its ties)
    SamplingParams(temperature=0.5, min_p=0.3, top_p=0.95),
    SamplingParams(temperature=1e39, top_k=2),  # 1/T underflows float32: order still holds
    SamplingParams(temperature=3e38, top_p=0.5, min_p=0.9),
    SamplingParams(temperature=1.0),  # nothing filters
]


@pytest.mark.parametrize("block,candidates", LAYOUTS)
def test_batched_filters_equal_the_float64_reference(block, candidates):
    """Every hand-made row under every filter setting, all in one batch per row."""
    for x in HAND_MADE:
        batch = np.stack([x] * len(FILTERS))
        theta = kept_threshold(batch, meta(FILTERS, [0] * len(FILTERS), [0] * len(FILTERS)),
                               block, candidates)
        for row, (p, t) in enumerate(zip(FILTERS, theta)):
            got = np.isfinite(x) & (x >= t)
            assert np.array_equal(got, reference_kept(x, p)), (x, p, row)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_random_rows_with_mixed_filters_equal_the_reference(dtype):
    rng = np.random.default_rng(3)
    for trial in range(60):
        v = int(rng.integers(8, 300))
        x = (rng.normal(size=(8, v)) * rng.choice([0.5, 3.0, 10.0])).astype(dtype)
        if trial % 2:
            x = np.round(x)  # ties
        x[rng.random(x.shape) < 0.2] = -np.inf
        x[:, 0] = 1.0  # every row keeps a finite logit
        params = [SamplingParams(
            temperature=float(rng.choice([1e-4, 0.3, 1.0, 50.0, 1e300])),
            top_k=int(rng.choice([0, 1, 5, 50, v - 1, v])),
            top_p=float(rng.choice([1.0, 0.9, 0.5, 1e-300])),
            min_p=float(rng.choice([0.0, 0.1, 1.0]))) for _ in range(8)]
        for block, candidates in LAYOUTS:
            theta = kept_threshold(x, meta(params, [0] * 8, [0] * 8), block, candidates)
            for row, p in enumerate(params):
                got = np.isfinite(x[row]) & (x[row] >= theta[row])
                assert np.array_equal(got, reference_kept(x[row], p)), (trial, row, p)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7, top_k=4),
                                    SamplingParams(temperature=1.3, top_p=0.8),
                                    SamplingParams(temperature=1.0, min_p=0.05),
                                    SamplingParams(temperature=1.0)],
                         ids=["top_k", "top_p", "min_p", "plain"])
@pytest.mark.parametrize("block,candidates", [(256, 64), (2, 8)])
def test_draws_follow_the_kept_distribution(params, block, candidates):
    """3,000 draws (one seed, 3,000 positions) of one row: only kept tokens, with
    frequencies passing a chi-square test against ``softmax(x / T)`` over the kept set."""
    x = np.array([2.0, 1.5, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, -4.0, 0.2, 1.2],
                 np.float32)
    keep = reference_kept(x, params)
    w = np.where(keep, np.exp((x.astype(np.float64) - x.max()) / params.temperature), 0.0)
    n = 3000
    batch = np.broadcast_to(x, (n, len(x)))
    got = draw(batch, meta([params] * n, [5] * n, list(range(n))), block, candidates)
    counts = np.bincount(got, minlength=len(x))
    assert (counts[~keep] == 0).all()
    expected = counts[keep].sum() * (w[keep] / w[keep].sum())
    assert stats.chisquare(counts[keep], expected).pvalue > 1e-3, (counts, expected)


def test_seeded_request_samples_the_same_token_whatever_its_neighbours():
    seeded = SamplingParams(temperature=1.0, top_p=0.9, top_k=20, seed=7)
    mine = logits(0, 1)
    alone = [int(draw(mine, meta([seeded], [7], [p]))[0]) for p in range(8)]
    for neighbours in (1, 3):
        other = logits(neighbours, neighbours)
        batch = np.concatenate([other[:1], mine, other[1:]])
        params = [SamplingParams(temperature=0.7, seed=99)] + [seeded] + [
            SamplingParams()] * (neighbours - 1)
        seeds = [99, 7] + [0] * (neighbours - 1)
        for block, candidates in LAYOUTS:
            got = [int(draw(batch, meta(params, seeds, [p] * len(params)), block,
                            candidates)[1]) for p in range(8)]
            assert got == alone
    assert alone == [sample_one(mine[0], seeded, 7, p) for p in range(8)]
    assert len(set(alone)) > 1  # positions get different keys


def test_a_row_draws_the_same_token_on_candidates_and_over_its_whole_vocabulary():
    """Random rows and filters: the draw of every row is the same alone and in its batch,
    whatever the block size and candidate count (rows decided on candidates, rows that fall
    back to the whole row, rows nothing filters)."""
    rng = np.random.default_rng(4)
    for trial in range(40):
        v = int(rng.integers(16, 400))
        x = (rng.normal(size=(6, v)) * 3).astype(np.float32)
        if trial % 2:
            x = np.round(x).astype(np.float32)
        params = [SamplingParams(temperature=float(rng.choice([0.5, 1.0, 3.0])),
                                 top_k=int(rng.choice([0, 2, 10, 40])),
                                 top_p=float(rng.choice([1.0, 0.95, 0.6])),
                                 min_p=float(rng.choice([0.0, 0.02]))) for _ in range(6)]
        m = meta(params, rng.integers(0, 1 << 40, 6).tolist(), rng.integers(0, 99, 6).tolist())
        want = draw(x, m)
        for block, candidates in LAYOUTS[1:]:
            assert np.array_equal(draw(x, m, block, candidates), want)
        for row in range(6):
            assert draw(x[row:row + 1], m.rows(np.array([row])), 2, 4)[0] == want[row]


def test_greedy_requests_take_the_argmax_and_another_seed_draws_differently():
    batch = logits(5, 4)
    params = [SamplingParams(), SamplingParams(temperature=1.0), SamplingParams(),
              SamplingParams(temperature=1.0)]
    got = draw(batch, meta(params, [0, 1, 0, 2], [0, 0, 0, 0]))
    want = np.argmax(batch, axis=-1)
    assert got[0] == want[0] and got[2] == want[2]
    a = [sample_one(batch[1], params[1], 1, p) for p in range(16)]
    b = [sample_one(batch[1], params[1], 2, p) for p in range(16)]
    assert a != b


def test_request_key_depends_on_seed_and_position_only():
    assert request_key(3, 4) == request_key(3, 4)
    assert request_key(3, 4) != request_key(4, 3)
    assert 0 <= request_key(1 << 80, 5) < 1 << 64


def test_noise_depends_only_on_the_row_key_and_the_token():
    """A row's noise is the same alone and in any batch, at any column order; other keys
    give other noise; its uniforms pass a Kolmogorov-Smirnov test."""
    keys = np.array([request_key(s, p) for s, p in [(7, 0), (7, 1), (8, 0)]], np.uint64)
    ids = np.tile(np.arange(4096), (3, 1))
    noise = gumbel_noise(keys, ids)
    alone = gumbel_noise(keys[1:2], ids[1:2, ::-1])[0, ::-1]
    assert np.array_equal(noise[1], alone)
    assert not np.array_equal(noise[0], noise[1]) and not np.array_equal(noise[0], noise[2])
    uniforms = np.exp(-np.exp(-noise))  # the Gumbel CDF
    for row in uniforms:
        assert stats.kstest(row, "uniform").pvalue > 1e-3
