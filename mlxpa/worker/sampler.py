"""The step's sampler: logits processing in vLLM's order, then one draw for all sampled rows.

Order (vLLM v1's ``Sampler``): raw logits kept for log-probabilities; the grammar bitmask
(filled while ``mx.async_eval`` runs the forward pass); EOS and stop ids banned below
``min_tokens`` (in the bitmask when there is one); ``logit_bias`` and penalties
(:mod:`mlxpa.worker.penalties`); one ``mx.eval`` of the processed logits with the step's other
arrays; then temperature, min-p, top-k and top-p and the draw for every row together, on the
host (:mod:`mlxpa.worker.topk_topp_sampler`: greedy rows take the argmax). The matchers then consume
the tokens.

``min_tokens`` never empties a row: when the ban would leave nothing to sample (the grammar
admits only EOS or stop ids, or the ids cover the vocabulary), the row keeps what it allowed,
and a complete grammar ends the request (vLLM's rule: the grammar is authoritative).

Speculative decoding: a request with ``k`` draft tokens has ``k + 1`` rows, row ``j``
processed as if the first ``j`` drafts were its output (the grammar mask, ``min_tokens``,
penalties and the noise key of output position ``num_output_tokens + j``), so its tokens are
what sequential decoding would sample after those drafts. The request emits rows' tokens
while each equals the draft it verifies, then the first that differs (or the one after the
last draft): the drafts are a point mass, so this is exact for greedy and sampled rows alike,
and a seeded row gives the same tokens with speculation on or off.
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx
import numpy as np

from mlxpa.request import Request, TokenLogprob
from mlxpa.structured.mask import apply_bitmask, ban_in_bitmask
from mlxpa.structured.matchers import Grammars
from mlxpa.worker.logprobs import token_logprobs
from mlxpa.worker.penalties import PenaltyState, apply_penalties, gather_entries
from mlxpa.worker.topk_topp_sampler import SamplingMetadata, draw


class Rows(NamedTuple):
    """A step's sampling rows: each request's row, then one row per draft token of it.

    Attributes:
        reqs: The request of each row.
        ahead: The draft tokens each row samples after (``()``: the request's own row).
        owner: The index of each row's request.
        first: Per request, the index of its first row.
    """

    reqs: list[Request]
    ahead: list[tuple[int, ...]]
    owner: list[int]
    first: list[int]

    @classmethod
    def of(cls, reqs: list[Request], drafts: list[list[int]] | None = None) -> Rows:
        """The rows of ``reqs`` with ``drafts`` (per request; None: none)."""
        rows, ahead, owner, first = [], [], [], []
        for i, req in enumerate(reqs):
            first.append(len(rows))
            d = tuple(drafts[i]) if drafts else ()
            rows.extend([req] * (len(d) + 1))
            owner.extend([i] * (len(d) + 1))
            ahead.extend(d[:j] for j in range(len(d) + 1))
        return cls(rows, ahead, owner, first)

    def positions(self) -> list[int]:
        """The output position each row samples."""
        return [r.num_output_tokens + len(a) for r, a in zip(self.reqs, self.ahead)]


def sampling_metadata(rows: Rows, seeds: list[int]) -> SamplingMetadata:
    """The step's :class:`SamplingMetadata`: each row's parameters, its request's seed
    (``seeds``, per request) and the output position of the token it samples."""
    return SamplingMetadata.of([r.sampling_params for r in rows.reqs],
                               [seeds[i] for i in rows.owner], rows.positions())


class Sampled(NamedTuple):
    """What a step's sampling requests produced (index ``i`` is the ``i``-th request).

    Attributes:
        tokens: Per request, the tokens it emits: one, or after drafts the accepted drafts
            and the next token (cut after a token that ends its grammar).
        logprobs: Per request that asks, the :class:`TokenLogprob` of each emitted token.
        grammar_ended: The constrained requests whose grammar ended with their last token:
            None when complete, else the error (:meth:`Grammars.advance`).
        mask_time_s: Seconds spent filling the grammar bitmask, None when none was filled.
    """

    tokens: list[list[int]]
    logprobs: dict[int, list[TokenLogprob]]
    grammar_ended: dict[int, str | None]
    mask_time_s: float | None


NOTHING_SAMPLED = Sampled([], {}, {}, None)


def accept(rows: Rows, drafts: list[list[int]] | None, tokens: list[int]) -> list[list[int]]:
    """Per request, its emitted tokens: the rows' tokens while each equals the draft it
    verifies, then the first that differs or the one after the last draft."""
    out = []
    for i, f in enumerate(rows.first):
        d = drafts[i] if drafts else ()
        m = 0
        while m < len(d) and tokens[f + m] == d[m]:
            m += 1
        out.append(tokens[f:f + m + 1])
    return out


def early_stop_bans(reqs: list[Request], eos_token_ids: list[int], width: int,
                    ahead: list[tuple[int, ...]] | None = None) -> dict[int, list[int]]:
    """EOS and stop token ids banned for each row whose request has not yet generated
    ``min_tokens`` tokens (vLLM's ``min_tokens`` rule), counting the row's ``ahead`` drafts.

    Returns:
        Row (index in ``reqs``) to its sorted banned ids (rows without a ban are absent).

    Raises:
        IndexError: A banned id is not below ``width`` (the engine refuses such requests; a
            scatter out of range would write another row or crash).
    """
    bans = {}
    for i, r in enumerate(reqs):
        sp = r.sampling_params
        if r.num_output_tokens + (len(ahead[i]) if ahead else 0) < sp.min_tokens:
            banned = sorted(set(sp.stop_token_ids) | set(eos_token_ids))
            if banned and not 0 <= banned[0] <= banned[-1] < width:
                raise IndexError(f"token ids {banned} outside the logits' {width} columns")
            if banned:
                bans[i] = banned
    return bans


def mask_early_stops(logits: mx.array, reqs: list[Request], eos_token_ids: list[int],
                     ahead: list[tuple[int, ...]] | None = None) -> mx.array:
    """EOS and stop token ids get -inf logits in rows that have not yet generated
    ``min_tokens`` tokens (:func:`early_stop_bans`). ``logits`` is ``[S, V]``, updated. A row
    whose banned ids would cover the whole vocabulary is left as it is (there would be
    nothing to sample).

    Raises:
        IndexError: As :func:`early_stop_bans`.
    """
    width = logits.shape[-1]
    bans = {i: ids for i, ids in early_stop_bans(reqs, eos_token_ids, width, ahead).items()
            if len(ids) < width}
    rows = [i for i, ids in bans.items() for _ in ids]
    if rows:
        logits[mx.array(rows), mx.array([t for ids in bans.values() for t in ids])] = -mx.inf
    return logits


class Sampler:
    """Samples one token per row of a step's logits (vLLM's ``Sampler``).

    Args:
        eos_token_ids: The model's EOS ids (banned below ``min_tokens``).
        grammars: The constrained requests' matchers (None: no constraints possible); the
            bitmask is ``grammars.vocab_size`` wide.
        penalties: The runner's ``logit_bias`` and penalty entries (None: no request can set
            them).
    """

    def __init__(self, eos_token_ids: list[int], grammars: Grammars | None,
                 penalties: PenaltyState | None) -> None:
        self.eos_token_ids = list(eos_token_ids)
        self.grammars = grammars
        self.penalties = penalties

    def sample(self, logits: list[mx.array], reqs: list[Request], seeds: list[int],
               pending: list[mx.array], drafts: list[list[int]] | None = None) -> Sampled:
        """Process, evaluate and sample one step.

        Args:
            logits: The step's ``[S, V]`` raw logits (lazy), one row per :class:`Rows` row,
                as the one item of a list, which is emptied so that nothing else holds them:
                the mask may then write into their buffer when no request reads the raw
                logits afterwards.
            reqs: The sampling requests.
            seeds: Their seeds.
            pending: Other arrays to evaluate with the logits (the KV pools, the step's other
                log-probability reads).
            drafts: Per request, the draft tokens its rows verify (None: none).

        Returns:
            The emitted tokens, the asked-for log-probabilities and the grammar endings.
        """
        rows = Rows.of(reqs, drafts)
        asks = [i for i, r in enumerate(reqs) if r.sampling_params.logprobs is not None]
        raw = logits[0] if asks else None  # read again for the log-probabilities
        bitmask, processed = self._process(logits, rows, drafts, pending, keep_raw=bool(asks))
        if processed.dtype != mx.float32:
            processed = processed.astype(mx.float32)
        mx.eval(processed, *pending)
        drawn = draw(np.asarray(processed), sampling_metadata(rows, seeds)).tolist()
        del processed
        tokens = accept(rows, drafts, drawn)
        ended = {} if bitmask is None else self.grammars.advance(reqs, tokens)
        logprobs = {}
        if asks:
            idx = [rows.first[i] + j for i in asks for j in range(len(tokens[i]))]
            values = iter(token_logprobs(raw[mx.array(idx)], [t for i in asks for t in tokens[i]],
                                         [reqs[i].sampling_params.logprobs for i in asks
                                          for _ in tokens[i]], ranks=True))
            logprobs = {i: [next(values) for _ in tokens[i]] for i in asks}
        return Sampled(tokens, logprobs, ended, None if bitmask is None else bitmask.fill_s)

    def _process(self, logits: list[mx.array], rows: Rows, drafts: list[list[int]] | None,
                 pending: list[mx.array], keep_raw: bool):
        """The grammar mask, ``min_tokens`` and penalties applied to the raw logits (the one
        item of ``logits``, popped; ``keep_raw``: the caller reads them afterwards); returns
        ``(bitmask or None, processed logits)``, lazy. The host work (bitmask, penalty
        entries) overlaps the forward pass, which ``mx.async_eval`` starts."""
        raw = logits.pop()
        grammars, penalties, reqs = self.grammars, self.penalties, rows.reqs
        bitmask = entries = None
        constrained = grammars is not None and any(
            r.sampling_params.structured_outputs is not None for r in reqs)
        if constrained or (penalties is not None and any(
                r.sampling_params.penalised for r in reqs)):
            mx.async_eval(raw, *pending)
            bitmask = grammars.fill(rows, drafts) if constrained else None
            entries = penalties.step(reqs, rows.ahead) if penalties is not None else None
            mx.synchronize()  # the finished async evaluation lets go of the raw logits
        if bitmask is not None:
            ban_in_bitmask(bitmask.words, early_stop_bans(reqs, self.eos_token_ids,
                                                          grammars.vocab_size, rows.ahead))
            out = apply_bitmask(raw, bitmask.words)
        else:  # the scatter writes into a copy when the raw logits are read afterwards
            out = mask_early_stops(raw + 0 if keep_raw else raw, reqs, self.eos_token_ids,
                                   rows.ahead)
        del raw
        if entries is not None:
            values = gather_entries(out, entries)
            mx.eval(values)  # now nothing but `out` holds the masked logits: scatter in place
            out = apply_penalties(out, values, entries)
        return bitmask, out
