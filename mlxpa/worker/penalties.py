"""``logit_bias`` and the repetition, frequency and presence penalties of a step, in one pass.

Definitions (vLLM's ``apply_penalties``, ``vllm/model_executor/layers/utils.py``, after its
``logit_bias`` processor; OpenAI's presence and frequency penalties), for each token ``t`` of a
request's row of logits::

    logit += logit_bias.get(t, 0)
    if t occurs in the prompt or the output so far:               # repetition_penalty r
        logit = logit / r if logit > 0 else logit * r
    logit -= frequency_penalty * count(t) + presence_penalty * (count(t) > 0)

where ``count(t)`` counts ``t`` in the output only. A masked logit (``-inf``: grammar,
``min_tokens``) stays ``-inf``, whatever ``r``; every other result is finite: a penalty
float32 cannot hold (``1e-300``, ``1e300``: valid rows) is clamped to float32's normal
range, and a result beyond the logits' dtype to its largest finite value of that sign.

Only the entries a request's settings can change are touched: its ``logit_bias`` ids, the
distinct tokens of its prompt (when ``repetition_penalty != 1``) and of its output. The runner
keeps them per request (:class:`PenaltyState`; vLLM's v1 GPU worker keeps dense per-request bin
counts instead), adds each sampled token as it arrives, forgets a request when it finishes or
is preempted and rebuilds it from the prompt and the kept output tokens when it samples
again; a step pays for its new tokens, and for the concatenation of its rows' entries, never
for a recount of a context. All rows' entries go through one gather, one element-wise
expression and one scatter (:func:`apply_penalties`); rows that set nothing have no entry, and
a step where no row sets anything builds nothing.

The scatter writes into the step's logits buffer in place, which MLX can only do when nothing
else in the graph still reads that buffer; the gather does, so the gathered values are
evaluated first (:func:`gather_entries`, together with the forward pass) and the scatter
comes after. Otherwise MLX would copy the whole ``[S, V]`` logits every step.
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx
import numpy as np

from mlxpa.request import Request

_F32 = np.finfo(np.float32)
# A repetition penalty is applied in float32: one outside float32's normal range would cast
# to 0 or inf (then -inf * 0 and 0 * inf are NaN), so it is clamped into the range first.
_MIN_FACTOR, _MAX_FACTOR = float(_F32.tiny), float(_F32.max)


class StepPenalties(NamedTuple):
    """A step's entries, ``K`` of them, each a ``(row, token)`` pair to change.

    Attributes:
        rows: ``[K]`` int32 row of the step's logits.
        cols: ``[K]`` int32 token id.
        bias: ``[K]`` float32 ``logit_bias`` of the token (0 when none).
        factor: ``[K]`` float32 repetition penalty of a token that occurs in the prompt or
            output (1 for a token that does not).
        sub: ``[K]`` float32 ``frequency_penalty * count + presence_penalty * (count > 0)``.
    """

    rows: mx.array
    cols: mx.array
    bias: mx.array
    factor: mx.array
    sub: mx.array


class _Tracked:
    """One request's entries: distinct token ids (unordered), each with its bias, whether it
    occurs in the prompt or the output, and its count in the output; grown as tokens come."""

    __slots__ = ("ids", "bias", "seen", "count", "n", "slot", "num_counted", "outputs")

    def __init__(self, req: Request) -> None:
        sp = req.sampling_params
        self.outputs = sp.repetition_penalty != 1 or bool(sp.presence_penalty) or bool(
            sp.frequency_penalty)
        bias = sp.logit_bias or {}
        bias_ids = np.fromiter(bias, np.int64, len(bias))
        prompt = (np.asarray(req.prompt_token_ids, np.int64) if sp.repetition_penalty != 1
                  else np.zeros(0, np.int64))
        out = np.asarray(req.output_token_ids if self.outputs else (), np.int64)
        ids = np.unique(np.concatenate([bias_ids, prompt, out]))
        self.n = n = len(ids)
        size = max(16, 2 * n)
        self.ids = np.zeros(size, np.int32)
        self.ids[:n] = ids
        self.bias = np.zeros(size, np.float32)
        self.bias[np.searchsorted(ids, bias_ids)] = np.fromiter(bias.values(), np.float32,
                                                                len(bias))
        self.seen = np.zeros(size, bool)
        self.seen[np.searchsorted(ids, np.concatenate([prompt, out]))] = True
        self.count = np.zeros(size, np.float32)
        np.add.at(self.count, np.searchsorted(ids, out), 1)
        self.slot = dict(zip(ids.tolist(), range(n)))
        self.num_counted = len(out)

    def sync(self, output_token_ids: list[int]) -> None:
        """Count the output tokens added since the last call (O(new tokens))."""
        if not self.outputs:
            return
        for t in output_token_ids[self.num_counted:]:
            i = self.slot.get(t)
            if i is None:
                i = self._append(t)
            self.seen[i] = True
            self.count[i] += 1
        self.num_counted = len(output_token_ids)

    def entries(self, ahead: tuple[int, ...] = ()) -> tuple[np.ndarray, ...]:
        """``(ids, bias, seen, count)`` of the tracked tokens, with ``ahead`` (draft tokens)
        counted as further output (copies; the tracked state is unchanged)."""
        n = self.n
        ids, bias, seen, count = self.ids[:n], self.bias[:n], self.seen[:n], self.count[:n]
        if not ahead or not self.outputs:
            return ids, bias, seen, count
        new = sorted({t for t in ahead if t not in self.slot})
        ids = np.concatenate([ids, np.array(new, np.int32)])
        bias = np.concatenate([bias, np.zeros(len(new), np.float32)])
        seen = np.concatenate([seen, np.zeros(len(new), bool)])
        count = np.concatenate([count, np.zeros(len(new), np.float32)])
        where = {t: n + j for j, t in enumerate(new)}
        for t in ahead:
            i = self.slot.get(t, where.get(t))
            seen[i] = True
            count[i] += 1
        return ids, bias, seen, count

    def _append(self, token_id: int) -> int:
        i = self.n
        if i == len(self.ids):
            for name in ("ids", "bias", "seen", "count"):
                old = getattr(self, name)
                new = np.zeros(2 * len(old), old.dtype)
                new[:i] = old
                setattr(self, name, new)
        self.ids[i] = token_id
        self.slot[token_id] = i
        self.n = i + 1
        return i


class PenaltyState:
    """Runner-side ``logit_bias`` and penalty entries of the requests that set them.

    The runner calls :meth:`drop` with the requests the scheduler says finished or were
    preempted, and :meth:`step` with the requests that sample in a step.
    """

    def __init__(self) -> None:
        self._tracked: dict[int, _Tracked] = {}  # by request key

    def __len__(self) -> int:
        return len(self._tracked)

    def drop(self, reqs: list[Request]) -> None:
        """Forget ``reqs`` (finished, or preempted: rebuilt from their output tokens when
        they sample again)."""
        for req in reqs:
            self._tracked.pop(req.key, None)

    def step(self, reqs: list[Request],
             ahead: list[tuple[int, ...]] | None = None) -> StepPenalties | None:
        """The entries of the step whose sampling rows are ``reqs`` (row ``i`` is
        ``reqs[i]``; a request may have several rows, ``ahead[i]`` the draft tokens row
        ``i`` counts as output after the request's own), or None when no row sets
        ``logit_bias`` or a penalty (or none has an entry yet: a presence penalty before the
        first output token)."""
        rows = [i for i, r in enumerate(reqs) if r.sampling_params.penalised]
        if not rows:
            return None
        parts = []
        for i in rows:
            req = reqs[i]
            t = self._tracked.get(req.key)
            if t is None:
                t = self._tracked[req.key] = _Tracked(req)
            elif t.num_counted != req.num_output_tokens:
                t.sync(req.output_token_ids)
            parts.append(t.entries(ahead[i] if ahead else ()))
        lens = [len(ids) for ids, *_ in parts]
        if not sum(lens):
            return None
        params = [reqs[i].sampling_params for i in rows]
        count = np.concatenate([c for *_, c in parts])
        seen = np.concatenate([s for _, _, s, _ in parts])
        rep = np.repeat(np.clip(np.array([p.repetition_penalty for p in params]), _MIN_FACTOR,
                                _MAX_FACTOR).astype(np.float32), lens)
        freq = np.repeat(np.array([p.frequency_penalty for p in params], np.float32), lens)
        pres = np.repeat(np.array([p.presence_penalty for p in params], np.float32), lens)
        return StepPenalties(
            rows=mx.array(np.repeat(np.array(rows, np.int32), lens)),
            cols=mx.array(np.concatenate([ids for ids, *_ in parts])),
            bias=mx.array(np.concatenate([b for _, b, *_ in parts])),
            factor=mx.array(np.where(seen, rep, np.float32(1))),
            sub=mx.array(freq * count + pres * (count > 0)))


def gather_entries(logits: mx.array, entries: StepPenalties) -> mx.array:
    """``[K]`` logits at the step's entries (lazy; evaluate it before :func:`apply_penalties`
    so that the scatter can write into the logits' buffer)."""
    return logits[entries.rows, entries.cols]


def apply_penalties(logits: mx.array, values: mx.array, entries: StepPenalties) -> mx.array:
    """``logit_bias`` and the penalties at every entry of the step (module docstring).

    Args:
        logits: ``[S, V]`` logits after the grammar mask and ``min_tokens``; updated in
            place (the same object is returned).
        values: ``[K]`` the logits at the entries, already evaluated
            (:func:`gather_entries`).
        entries: The step's entries (:meth:`PenaltyState.step`).

    Returns:
        ``logits``, penalised.
    """
    v = values.astype(mx.float32) + entries.bias
    p = mx.where(v > 0, v / entries.factor, v * entries.factor) - entries.sub
    # a factor near float32's limits overflows the logits' dtype: its largest finite value
    # instead (a masked -inf stays -inf)
    big = mx.finfo(logits.dtype).max
    p = mx.where(v == -mx.inf, v, mx.clip(p, -big, big))
    logits[entries.rows, entries.cols] = p.astype(logits.dtype)
    return logits
