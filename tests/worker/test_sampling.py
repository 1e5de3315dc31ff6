"""``sample``: greedy requests by argmax, seeded requests reproducible whatever their batch
neighbours (the per-request key of seed and output position), checked against sampling the
request alone and against numpy's argmax."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from mlxpa.sampling_params import SamplingParams
from mlxpa.worker.sampling import request_key, sample, sample_one

VOCAB = 50


def logits(seed: int, rows: int) -> mx.array:
    return mx.array(np.random.default_rng(seed).normal(size=(rows, VOCAB)).astype(np.float32))


def test_seeded_request_samples_the_same_token_whatever_its_neighbours():
    seeded = SamplingParams(temperature=1.0, top_p=0.9, top_k=20, seed=7)
    mine = logits(0, 1)
    alone = [int(sample(mine, [seeded], [7], [p]).item()) for p in range(8)]
    for neighbours in (1, 3):
        other = logits(neighbours, neighbours)
        batch = mx.concatenate([other[:1], mine, other[1:]])
        params = [SamplingParams(temperature=0.7, seed=99)] + [seeded] + [
            SamplingParams()] * (neighbours - 1)
        seeds = [99, 7] + [0] * (neighbours - 1)
        got = [int(sample(batch, params, seeds, [p] * len(params))[1].item()) for p in range(8)]
        assert got == alone
    assert alone == [int(sample_one(mine, seeded, 7, p).item()) for p in range(8)]
    assert len(set(alone)) > 1  # positions get different keys


def test_greedy_requests_take_the_argmax_and_another_seed_draws_differently():
    batch = logits(5, 4)
    params = [SamplingParams(), SamplingParams(temperature=1.0), SamplingParams(),
              SamplingParams(temperature=1.0)]
    got = np.array(sample(batch, params, [0, 1, 0, 2], [0, 0, 0, 0]))
    want = np.argmax(np.array(batch), axis=-1)
    assert got[0] == want[0] and got[2] == want[2]
    a = [int(sample_one(batch[1:2], params[1], 1, p).item()) for p in range(16)]
    b = [int(sample_one(batch[1:2], params[1], 2, p).item()) for p in range(16)]
    assert a != b


def test_request_key_depends_on_seed_and_position_only():
    assert np.array_equal(np.array(request_key(3, 4)), np.array(request_key(3, 4)))
    assert not np.array_equal(np.array(request_key(3, 4)), np.array(request_key(4, 3)))
