"""``logit_bias`` and the repetition, frequency and presence penalties against a float64 numpy
reference of their definitions (vLLM's ``apply_penalties``, OpenAI's penalties), on random
logits with negative and masked (``-inf``) entries and random prompts and outputs with
repeated tokens, tokens only in the prompt and only in the output; rows that set nothing sit
next to rows that do, greedy rows next to sampled ones, in one batched step."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxpa.request import Request
from mlxpa.sampling_params import SamplingParams
from mlxpa.worker.penalties import PenaltyState, apply_penalties, gather_entries
from mlxpa.worker.sampler import Sampler
from mlxpa.worker.topk_topp_sampler import SamplingMetadata, draw

V = 64


def sample_step(parts, reqs, seeds, eos_token_ids, grammars, pending, penalties):
    """One step of the runner's :class:`Sampler` on ``parts`` (one ``[S, V]`` logits), one
    token per request (no drafts)."""
    res = Sampler(eos_token_ids, grammars, penalties).sample(parts, reqs, seeds, pending)
    return res._replace(tokens=[t for (t,) in res.tokens])


def reference(logits: np.ndarray, reqs: list[Request]) -> np.ndarray:
    """The definitions in float64, one row at a time, straight from the text of each."""
    out = logits.astype(np.float64).copy()
    for i, req in enumerate(reqs):
        sp = req.sampling_params
        row = out[i]
        for t, b in (sp.logit_bias or {}).items():
            row[t] += b
        seen = set(req.prompt_token_ids) | set(req.output_token_ids)
        for t in seen:  # repetition: prompt and output tokens
            row[t] = row[t] / sp.repetition_penalty if row[t] > 0 else (
                row[t] * sp.repetition_penalty)
        for t in set(req.output_token_ids):  # frequency and presence: output tokens only
            count = req.output_token_ids.count(t)
            row[t] -= sp.frequency_penalty * count + sp.presence_penalty
    return out


def random_request(rng, params: SamplingParams, name: str) -> Request:
    prompt = rng.integers(0, V // 2, size=int(rng.integers(3, 20))).tolist()  # repeats
    # half of the output ids only occur in the output (V//2..V-1), half may be in the prompt
    out = rng.integers(0, V, size=int(rng.integers(0, 12))).tolist()
    return Request(name, prompt, params, output_token_ids=out)


def random_logits(rng, rows: int) -> np.ndarray:
    x = (rng.normal(size=(rows, V)) * 3).astype(np.float32)  # negative and positive
    x[rng.random(size=x.shape) < 0.1] = -np.inf  # masked entries stay masked
    return x


PARAMS = [
    SamplingParams(),  # sets nothing
    SamplingParams(repetition_penalty=1.7),
    SamplingParams(repetition_penalty=0.6, temperature=0.8),  # < 1 favours repeats
    SamplingParams(presence_penalty=1.5),
    SamplingParams(frequency_penalty=-0.7, temperature=1.0),
    SamplingParams(logit_bias={3: 5.0, 40: -100.0, 63: 2.5}),
    SamplingParams(repetition_penalty=1.3, presence_penalty=-2.0, frequency_penalty=2.0,
                   logit_bias={0: 1.0, 5: -3.0}, temperature=0.5),
    SamplingParams(temperature=1.0),  # sets nothing, sampled
]


def apply(state: PenaltyState, logits: np.ndarray, reqs: list[Request]) -> np.ndarray:
    entries = state.step(reqs)
    x = mx.array(logits)
    if entries is None:
        return np.array(x)
    values = gather_entries(x, entries)
    mx.eval(values)
    return np.array(apply_penalties(x, values, entries))


@pytest.mark.parametrize("seed", range(5))
def test_one_batched_pass_matches_the_definitions(seed):
    rng = np.random.default_rng(seed)
    reqs = [random_request(rng, p, str(i)) for i, p in enumerate(PARAMS)]
    logits = random_logits(rng, len(reqs))
    got = apply(PenaltyState(), logits, reqs)
    want = reference(logits, reqs)
    assert np.array_equal(np.isneginf(got), np.isneginf(want))  # masked stays masked
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6, atol=1e-5)
    assert np.array_equal(got[0], logits[0]) and np.array_equal(got[7], logits[7])


def test_rows_that_set_nothing_have_no_entries_and_a_plain_step_builds_nothing():
    rng = np.random.default_rng(0)
    reqs = [random_request(rng, p, str(i)) for i, p in enumerate(PARAMS)]
    state = PenaltyState()
    entries = state.step(reqs)
    rows = set(np.array(entries.rows).tolist())
    assert rows == {1, 2, 3, 4, 5, 6}
    plain = [random_request(rng, SamplingParams(temperature=t), str(t)) for t in (0, 1)]
    fresh = PenaltyState()
    assert fresh.step(plain) is None and len(fresh) == 0
    # only the bias ids: a row with logit_bias alone tracks no prompt or output token
    assert np.array(entries.cols)[np.array(entries.rows) == 5].tolist() == [3, 40, 63]
    # a presence penalty before the first output token has nothing to change
    first = Request("p", [1, 2, 3], SamplingParams(presence_penalty=1.0))
    assert PenaltyState().step([first]) is None


def test_counts_follow_new_tokens_preemption_and_forks():
    """The runner's entries are updated token by token, and rebuilt from the kept output
    tokens after a preemption: every step equals a fresh rebuild and the reference."""
    rng = np.random.default_rng(3)
    state = PenaltyState()
    reqs = [random_request(rng, p, str(i)) for i, p in enumerate(PARAMS)]
    for step in range(12):
        logits = random_logits(rng, len(reqs))
        got = apply(state, logits, reqs)
        rebuilt = apply(PenaltyState(), logits, reqs)
        want = reference(logits, reqs)
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6, atol=1e-5)
        np.testing.assert_array_equal(got, rebuilt)
        for r in reqs:  # each row samples one more token, often a repeat
            r.output_token_ids.append(int(rng.choice(r.output_token_ids or [V - 1])
                                          if rng.random() < 0.5 else rng.integers(0, V)))
        if step == 5:
            state.drop(reqs[2:4])  # preempted: their output tokens stay
    state.drop(reqs)
    assert len(state) == 0


def test_greedy_and_sampled_rows_sample_from_the_penalised_logits():
    """Through the step's sampler: greedy rows are the argmax of the reference, sampled rows
    draw what ``draw`` draws from the reference with the same seeds (the penalties come
    before temperature, top-k, top-p, min-p)."""
    rng = np.random.default_rng(11)
    reqs = [random_request(rng, p, str(i)) for i, p in enumerate(PARAMS)]
    logits = random_logits(rng, len(reqs))
    logits[:, 0] = 0.0  # a zero logit is multiplied (stays 0) by the repetition penalty
    seeds = list(range(len(reqs)))
    res = sample_step([mx.array(logits)], reqs, seeds, [], None, [], PenaltyState())
    want = reference(logits, reqs)
    positions = [r.num_output_tokens for r in reqs]
    drawn = draw(want.astype(np.float32),
                 SamplingMetadata.of([r.sampling_params for r in reqs], seeds, positions))
    assert res.tokens == drawn.tolist()
    greedy = [i for i, r in enumerate(reqs) if r.sampling_params.greedy]
    assert [res.tokens[i] for i in greedy] == np.argmax(want[greedy], axis=-1).tolist()


def test_min_tokens_ban_then_penalties():
    """``min_tokens`` bans EOS before the bias is added: a +100 bias cannot bring it back."""
    req = Request("m", [4, 5], SamplingParams(min_tokens=2, logit_bias={1: 100.0}))
    logits = np.zeros((1, V), np.float32)
    res = sample_step([mx.array(logits)], [req], [0], [1], None, [], PenaltyState())
    assert res.tokens != [1]
    req.output_token_ids = [7, 8]  # min_tokens reached: the bias wins
    res = sample_step([mx.array(logits)], [req], [0], [1], None, [], PenaltyState())
    assert res.tokens == [1]


def test_the_scatter_writes_into_the_logits_buffer():
    """No ``[S, V]`` copy: the step's peak stays well below a second logits buffer (MLX
    copies when the gather still holds the buffer the scatter writes, hence the gather is
    evaluated first)."""
    rows, width = 128, 1 << 16
    rng = np.random.default_rng(0)
    reqs = [Request(str(i), rng.integers(0, width, 300).tolist(),
                    SamplingParams(repetition_penalty=1.2, frequency_penalty=0.5),
                    output_token_ids=rng.integers(0, width, 100).tolist())
            for i in range(rows)]
    x = mx.random.normal((rows, width)) * 1
    mx.eval(x)
    parts = [x]
    del x
    mx.synchronize()
    base = mx.get_active_memory()
    mx.reset_peak_memory()
    sample_step(parts, reqs, [0] * rows, [], None, [], PenaltyState())
    assert mx.get_peak_memory() - base < rows * width * 4 // 2


@pytest.mark.filterwarnings("error")  # no numpy overflow warning on the way either
@pytest.mark.parametrize("r", [1e-320, 1e-300, 1e-40, 1e39, 1e300])
def test_a_repetition_penalty_beyond_float32_keeps_masked_tokens_masked(r):
    """A penalty that float32 cannot hold (0 or inf once cast; 1e-320 is a valid JSON
    number) never turns a masked logit into NaN (``-inf * 0``) nor a zero one
    (``0 * inf``): masked entries stay ``-inf``; the penalty acts as the nearest float32
    normal number (the float64 reference with that penalty), and a result beyond float32
    is its largest finite value, on the same side of every entry that fits; greedy and
    sampled rows never pick a masked token."""
    rng = np.random.default_rng(7)
    params = [SamplingParams(repetition_penalty=r), SamplingParams(repetition_penalty=r,
                                                                  temperature=1.0)]
    reqs = [random_request(rng, p, str(i)) for i, p in enumerate(params)]
    logits = random_logits(rng, len(reqs))
    logits[:, 1] = 0.0  # 0 * inf would be NaN
    for req in reqs:  # masked tokens the rows have seen: -inf * 0 would be NaN
        req.output_token_ids += [int(t) for t in np.flatnonzero(np.isneginf(logits[0]))]
    got = apply(PenaltyState(), logits, reqs)
    f32 = np.finfo(np.float32)
    clamped = float(np.clip(r, f32.tiny, f32.max))
    with np.errstate(over="ignore"):
        want = reference(logits, [Request(q.request_id, q.prompt_token_ids, SamplingParams(
            repetition_penalty=clamped), output_token_ids=q.output_token_ids) for q in reqs])
    assert not np.isnan(got).any()
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    assert np.isfinite(got[~np.isneginf(want)]).all()
    fits = np.isfinite(want) & (np.abs(want) <= f32.max)
    np.testing.assert_allclose(got[fits], want[fits], rtol=1e-6, atol=1e-30)
    assert (np.abs(got[~fits & ~np.isneginf(want)]) == f32.max).all()
    for i in range(len(reqs)):
        row_fits = got[i][fits[i]]
        assert (got[i][want[i] > f32.max] > row_fits.max()).all()
        assert (got[i][np.isfinite(want[i]) & (want[i] < -f32.max)] < row_fits.min()).all()
    res = sample_step([mx.array(logits)], reqs, [0, 1], [], None, [], PenaltyState())
    assert not any(np.isneginf(logits[i, t]) for i, t in enumerate(res.tokens))
