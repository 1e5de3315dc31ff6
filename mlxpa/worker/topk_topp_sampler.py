"""Temperature, min-p, top-k and top-p over every sampled row together, and the draw.

For a row of logits ``x`` at temperature ``T`` (vLLM's definitions and order, ties kept
together): min-p keeps the tokens with ``softmax(x / T) >= min_p * max``; top-k those at least
as large as the k-th largest logit; top-p, over what those keep, the tokens whose strictly
larger kept tokens hold less than ``top_p`` of the kept mass. Each keeps ``{t: x_t >= θ}``, so
together they keep one such set. The draw is the Gumbel-max trick: the kept token with the
largest ``(x_t - max x) / T + g_t``, where ``g_t`` hashes the row's key (its seed and output
position) with ``t`` (SplitMix64, as vLLM's CPU sampler draws per-token noise): a row's token
depends on its logits, parameters, seed and position, never on its batch.

The filters need only a row's largest logits. The row is cut into blocks of :data:`BLOCK`;
the ``C`` blocks with the largest maxima hold its ``C`` largest logits, and every logit outside
them is at most the ``C``-th block maximum ``τ``. Their logits of at least ``τ`` are the row's
candidates. When its smallest candidate is filtered out, so is everything outside them: the
row is decided on a few hundred values after one pass over it (the block maxima). Otherwise
(a nucleus wider than the candidates, a tie at the edge) the row is sorted and the same test
runs on more of its largest logits each time, up to all of them. A row nothing filters
draws by inverse transform sampling with one uniform of its key instead of noise for every
token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlxpa.sampling_params import SamplingParams

BLOCK = 256  # logits per block
NUM_CANDIDATES = 64  # candidates of a row without top-k (top-p, min-p)
_MASK64 = (1 << 64) - 1
_GOLDEN, _MIX1, _MIX2 = (np.uint64(c) for c in (
    0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))

_INT64_MAX = int(np.iinfo(np.int64).max)


def request_key(seed: int, position: int) -> int:
    """The noise key (64 bits) of the token at output ``position`` of a request seeded with
    ``seed`` (a SplitMix64 mix of both, so nearby seeds and positions give unrelated keys)."""
    z = (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & _MASK64


@dataclass(frozen=True, slots=True)
class SamplingMetadata:
    """Per-row sampling inputs of a step, ``S`` rows (vLLM's ``SamplingMetadata``).

    Attributes:
        temperature: ``[S]`` float64 (unused on greedy rows).
        top_k: ``[S]`` int64, 0 where off.
        top_p: ``[S]`` float64, 1 where off.
        min_p: ``[S]`` float64, 0 where off.
        keys: ``[S]`` uint64 noise key of each row (:func:`request_key`).
        greedy: ``[S]`` bool, the rows that take the argmax.
    """

    temperature: np.ndarray
    top_k: np.ndarray
    top_p: np.ndarray
    min_p: np.ndarray
    keys: np.ndarray
    greedy: np.ndarray

    @classmethod
    def of(cls, params: list[SamplingParams], seeds: list[int],
           positions: list[int]) -> SamplingMetadata:
        """From each row's parameters, seed and output position (the index of the token
        being sampled, 0 for the first)."""
        return cls(np.array([p.temperature for p in params], np.float64),
                   # top_k at least the vocabulary is off: one past int64 is too
                   np.array([min(p.top_k, _INT64_MAX) for p in params], np.int64),
                   np.array([p.top_p for p in params], np.float64),
                   np.array([p.min_p for p in params], np.float64),
                   np.array([request_key(s, n) for s, n in zip(seeds, positions)], np.uint64),
                   np.array([p.greedy for p in params], bool))

    def rows(self, index: np.ndarray) -> SamplingMetadata:
        """The metadata of the rows ``index`` (an int array), in that order."""
        return SamplingMetadata(self.temperature[index], self.top_k[index], self.top_p[index],
                                self.min_p[index], self.keys[index], self.greedy[index])


def uniforms(keys: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``[R, M]`` float64 uniforms in (0, 1) for token ``ids[r, m]`` of row ``r``: a function
    of ``keys[r]`` (``[R]`` uint64) and the id alone (SplitMix64 of the key plus the id + 1
    times the golden ratio, 53 bits)."""
    z = keys.astype(np.uint64)[:, None] + (ids.astype(np.uint64) + np.uint64(1)) * _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z ^= z >> np.uint64(31)
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53


def gumbel_noise(keys: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``[R, M]`` float64 standard Gumbel noise of token ``ids[r, m]`` in row ``r``
    (:func:`uniforms` through the inverse of the Gumbel CDF)."""
    return -np.log(-np.log(uniforms(keys, ids)))


def draw(x: np.ndarray, meta: SamplingMetadata, block: int = BLOCK,
         num_candidates: int = NUM_CANDIDATES) -> np.ndarray:
    """One token per row of ``[S, V]`` processed logits (float32 or float64; the masks and
    penalties applied): the argmax on greedy rows, a draw after the filters elsewhere.

    Returns:
        ``[S]`` int64 token ids.
    """
    if meta.greedy.all():
        return x.argmax(axis=-1)
    tokens = np.empty(len(x), np.int64)
    greedy = np.flatnonzero(meta.greedy)
    if len(greedy):
        tokens[greedy] = x[greedy].argmax(axis=-1)
    rows = np.flatnonzero(~meta.greedy)
    tokens[rows] = _sample(x if len(rows) == len(x) else x[rows], meta.rows(rows), block,
                           num_candidates)
    return tokens


def sample_one(logits, params: SamplingParams, seed: int, position: int) -> int:
    """The token ``[V]`` logits (any float array) give under ``params``, seeded with
    ``seed``, at output ``position``: as in a step, whatever the batch."""
    row = np.asarray(logits, dtype=np.float64).reshape(1, -1)
    return int(draw(row, SamplingMetadata.of([params], [seed], [position]))[0])


def kept_threshold(x: np.ndarray, meta: SamplingMetadata, block: int = BLOCK,
                   num_candidates: int = NUM_CANDIDATES) -> np.ndarray:
    """Per row of ``[R, V]`` logits whose every row samples, the smallest logit the filters
    keep (they keep the finite logits ``x >= theta``; ``-inf`` where nothing filters), as
    :func:`draw` finds it."""
    return _decide(x, meta, block, num_candidates)[0]


def _sample(x: np.ndarray, meta: SamplingMetadata, block: int,
            num_candidates: int) -> np.ndarray:
    """Draws for ``[R, V]`` rows that all sample: among the candidates where they decide the
    row, among the row's tokens of at least its threshold elsewhere; a row nothing filters
    by inverse transform sampling (:func:`_inverse_cdf`)."""
    theta, (rows, ids, vals, valid) = _decide(x, meta, block, num_candidates)
    tokens = np.full(len(x), -1, np.int64)
    if len(rows):
        tokens[rows] = _pick(ids, vals, valid & (vals >= theta[rows, None]), vals[:, 0],
                             meta.temperature[rows], meta.keys[rows])
    plain = (meta.top_k <= 0) | (meta.top_k >= x.shape[1])
    plain &= (meta.top_p >= 1) & (meta.min_p <= 0)
    for i in np.flatnonzero(tokens < 0):
        if plain[i]:
            tokens[i] = _inverse_cdf(x[i], meta.temperature[i], meta.keys[i:i + 1], block)
            continue
        kept = np.flatnonzero(x[i] >= theta[i])
        tokens[i] = _pick(kept[None], x[i, kept][None], np.ones((1, len(kept)), bool),
                          x[i].max(), meta.temperature[i:i + 1], meta.keys[i:i + 1])[0]
    return tokens


def _inverse_cdf(row: np.ndarray, temperature: float, key: np.ndarray, block: int) -> int:
    """The token of a ``[V]`` row nothing filters: the first (in token order) whose cumulative
    ``exp((x - max x) / T)`` exceeds ``u`` times the total, ``u`` the row's own uniform
    (:func:`uniforms` of its key and id -1); block sums first, then one block's tokens (terms
    in the row's dtype, sums in float64)."""
    top = row.max()
    if not np.isfinite(top):  # nothing to sample: every token masked
        return int(row.argmax())
    w = np.exp((row - top) / row.dtype.type(min(temperature, float(np.finfo(row.dtype).max))))
    starts = np.arange(0, len(w), block)
    ends = np.cumsum(np.add.reduceat(w, starts, dtype=np.float64))
    target = uniforms(key, np.array([[-1]]))[0, 0] * ends[-1]
    b = min(int(np.searchsorted(ends, target, side="right")), len(starts) - 1)
    inner = np.cumsum(w[starts[b]:starts[b] + block], dtype=np.float64) + (
        ends[b - 1] if b else 0.0)
    token = starts[b] + min(int(np.searchsorted(inner, target, side="right")), len(inner) - 1)
    if w[token] == 0:  # rounded past the last token of weight: that one
        token = int(np.flatnonzero(w[:token + 1])[-1])
    return int(token)


def _decide(x: np.ndarray, meta: SamplingMetadata, block: int, num_candidates: int):
    """Each row's threshold (``[R]``), and the candidates of the rows they decide: ``(rows,
    ids, vals, valid)`` (:func:`_candidates`)."""
    r, v = x.shape
    k = np.where(meta.top_k >= v, 0, meta.top_k)  # k >= V keeps every token
    filtered = (k > 0) | (meta.top_p < 1) | (meta.min_p > 0)
    need = np.where(k > 0, k + 1, num_candidates)
    z = np.array([_kept_mass(x[i], meta.temperature[i], meta.min_p[i])
                  if k[i] == 0 and meta.top_p[i] < 1 else np.nan for i in range(r)])
    theta = np.full(r, -np.inf, x.dtype)
    rows = np.flatnonzero(filtered & (need <= (v // block) // 2))
    cands = (rows, *(np.zeros((0, 0), t) for t in (np.int64, x.dtype, bool)))
    if len(rows):
        ids, vals, valid = _candidates(x if len(rows) == r else x[rows],
                                       int(need[rows].max()), block)
        theta[rows], undecided = _thresholds(vals, valid, meta.temperature[rows], k[rows],
                                             meta.top_p[rows], meta.min_p[rows], z[rows])
        decided = ~undecided
        cands = (rows[decided], ids[decided], vals[decided], valid[decided])
    for i in np.setdiff1d(np.flatnonzero(filtered), cands[0]):
        top = np.sort(x[i])[::-1]  # then the row sorted: more of its largest logits each time
        for n in (64 * num_candidates, 512 * num_candidates, v):
            if n < v and k[i] >= n:
                continue
            t, still = _thresholds(top[None, :n], np.ones((1, min(n, v)), bool),
                                   meta.temperature[i:i + 1], k[i:i + 1], meta.top_p[i:i + 1],
                                   meta.min_p[i:i + 1], z[i:i + 1])
            if not still[0] or n >= v:
                theta[i] = t[0]
                break
    return theta, cands


def _kept_mass(row: np.ndarray, temperature: float, min_p: float) -> float:
    """``sum(exp((x - max x) / T))`` over the ``[V]`` row's tokens that min-p keeps: the mass
    top-p divides when no top-k bounds it (terms in the row's dtype, summed in float64)."""
    top = row.max()
    scale = row.dtype.type(min(temperature, float(np.finfo(row.dtype).max)))
    w = np.exp((row - top) / scale)
    if min_p > 0:
        w[row < _min_p_floor(top, temperature, min_p, row.dtype)] = 0.0
    return float(w.sum(dtype=np.float64))


def _min_p_floor(top, temperature, min_p, dtype):
    """The smallest logit min-p keeps, ``top + T log(min_p)`` in float64 (each argument a
    float or ``[R]`` array), rounded up to the logits' ``dtype`` so that comparing logits
    with it compares them with the float64 value."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        floor = np.asarray(top, np.float64) + temperature * np.log(min_p)
        cast = floor.astype(dtype)
    return np.where(cast < floor, np.nextafter(cast, dtype.type(np.inf)), cast)


def _candidates(x: np.ndarray, c: int, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each ``[R, V]`` row's candidates: the logits of at least ``τ`` (the ``c``-th largest
    block maximum) in its ``c`` blocks of largest maxima and in the tail past the last whole
    block; every other logit is at most ``τ``, and there are at least ``c`` candidates.

    Returns:
        ``(ids, vals, valid)``, each ``[R, M]``: token ids (int64), logits sorted largest
        first (equal logits by token id) and whether the entry is a candidate (the rest pad
        the row, ``-inf``).
    """
    r, v = x.shape
    nb = v // block
    main = x[:, :nb * block].reshape(r, nb, block)
    maxima = main.max(axis=-1)
    top = np.sort(np.argpartition(maxima, nb - c, axis=-1)[:, nb - c:], axis=-1)
    tau = np.take_along_axis(maxima, top, axis=-1).min(axis=-1)
    vals = main[np.arange(r)[:, None], top].reshape(r, c * block)
    ids = (top[:, :, None] * block + np.arange(block)).reshape(r, c * block)
    if nb * block < v:
        vals = np.concatenate([vals, x[:, nb * block:]], axis=-1)
        ids = np.concatenate([ids, np.broadcast_to(np.arange(nb * block, v), (r, v - nb * block))],
                             axis=-1)
    chosen = vals >= tau[:, None]
    counts = chosen.sum(axis=-1)
    m = int(counts.max())
    row, col = np.nonzero(chosen)  # row-major: token ids ascending within a row
    pos = np.arange(len(row)) - np.repeat(np.cumsum(counts) - counts, counts)
    cand_vals = np.full((r, m), -np.inf, x.dtype)
    cand_ids = np.zeros((r, m), np.int64)
    cand_vals[row, pos], cand_ids[row, pos] = vals[row, col], ids[row, col]
    order = np.argsort(-cand_vals, axis=-1, kind="stable")
    return (np.take_along_axis(cand_ids, order, axis=-1),
            np.take_along_axis(cand_vals, order, axis=-1), np.arange(m) < counts[:, None])


def _thresholds(vals: np.ndarray, valid: np.ndarray, temperature: np.ndarray, k: np.ndarray,
                top_p: np.ndarray, min_p: np.ndarray,
                z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The filters on each row's largest logits ``vals`` (``[R, M]``, sorted largest first;
    ``valid`` marks the entries; ``k < M`` where on; ``z``: the mass top-p divides where
    top-k is off and top-p on).

    Each filter keeps a prefix of ``vals``: min-p the entries of at least ``max + T
    log(min_p)``, top-k those at least the k-th; top-p, over what those keep, the entries
    whose strictly larger kept entries hold less than ``top_p`` of the mass: the prefix before
    the first entry whose exclusive cumulative mass reaches it, widened to its ties.

    Returns:
        ``(theta, open)``: the smallest kept logit of each row (keep ``x >= theta``), and
        whether tokens beyond ``vals`` may count (its last valid entry is kept, or passes
        top-k and min-p when top-k's mass feeds top-p): then ``theta`` holds only when
        ``vals`` is the whole row.
    """
    r, m = vals.shape
    rows = np.arange(r)
    v = vals.astype(np.float64)
    n = (valid & (v > -np.inf)).sum(axis=-1)
    with np.errstate(invalid="ignore"):
        d = (v - v[:, :1]) / temperature[:, None]
    floor = _min_p_floor(v[:, 0], temperature, min_p, vals.dtype)
    n = np.minimum(n, (vals >= floor[:, None]).sum(axis=-1))
    kth = v[rows, np.maximum(k, 1) - 1]
    n = np.where(k > 0, np.minimum(n, (v >= kth[:, None]).sum(axis=-1)), n)
    last = vals[rows, valid.sum(axis=-1) - 1]
    # top-k's mass comes from `vals`: complete only when its kept set ends inside them
    open_mass = (k > 0) & (top_p < 1) & (last >= vals[rows, np.maximum(n, 1) - 1])
    w = np.where(np.arange(m) < n[:, None], np.exp(d), 0.0)
    cum = np.cumsum(w, axis=-1)
    before = np.concatenate([np.zeros((r, 1)), cum[:, :-1]], axis=-1)
    mass = np.where(k > 0, cum[:, -1], z)
    within = (before < (top_p * mass)[:, None]).sum(axis=-1)
    n = np.where(top_p < 1, np.minimum(n, within), n)
    theta = vals[rows, np.maximum(n, 1) - 1]
    return theta, (last >= theta) | open_mass


def _pick(ids: np.ndarray, vals: np.ndarray, keep: np.ndarray, top: np.ndarray,
          temperature: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Per row, the kept token (``[R, M]`` ``ids``, their logits ``vals``) with the largest
    ``(x - top) / T + g``, ``top`` the row's largest logit; equal scores go to the smallest
    token id (a row of NaN scores to its first id)."""
    v = vals.astype(np.float64)
    top = np.asarray(top, np.float64).reshape(-1, 1)
    with np.errstate(invalid="ignore"):
        score = np.where(keep, (v - top) / temperature[:, None] + gumbel_noise(keys, ids),
                         -np.inf)
    best = score.max(axis=-1, keepdims=True)
    picked = np.where(score == best, ids, np.iinfo(np.int64).max).min(axis=-1)
    return np.where(np.isnan(best[:, 0]), ids[:, 0], picked)
