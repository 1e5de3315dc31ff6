"""Choice rows are scored, not decoded: every label's log-probability, then the row's label.

Scores: for label ``c`` with tokens ``t_1..t_k`` after the prompt (where labels start and end:
:mod:`mlxpa.structured.labels`), ``choice_logprobs[c] = sum_j log p(t_j | prompt, t_1..t_{j-1})``,
teacher-forced, from the model's raw log-softmax (no temperature, no filter). It is the
probability that the model writes exactly those tokens next (not that it stops after them);
other tokenizations of the same text are not added.

The row's label: the first label with the highest score at temperature 0 (ties go to the
label given first); otherwise a draw from ``softmax(score / temperature)`` over the labels
after ``top_p``, ``top_k`` and ``min_p`` over them, with token sampling's own filters and
key (:func:`mlxpa.worker.topk_topp_sampler.sample_one`, output position 0), sample ``i`` of
``n`` with sample ``i``'s seed (:meth:`mlxpa.worker.model_runner.ModelRunner.seed_for`). A choice
row never samples from the vocabulary and spends no decode step. Its output also carries
``choice_probs`` (``softmax`` of the scores: they sum to 1) and ``choice_outside_prob``
(``1 - sum(exp(score))`` over the labels whose tokens do not extend another label's tokens:
a label that extends another is inside that one's event, so only these are disjoint).

What else a row's fields mean here: ``max_tokens`` below the chosen label's token count
cuts the label to its first ``max_tokens`` tokens (finish reason ``length``, as a decoded
choice cut by ``max_tokens`` in vLLM); the label is still chosen from every label's whole
score. ``stop``, ``stop_token_ids``, ``min_tokens`` and ``ignore_eos`` do not apply: the text
is a whole label; ``prompt_logprobs`` is refused (:class:`~mlxpa.sampling_params.SamplingParams`).
``logprobs`` gives the chosen label's per-token teacher-forced values (``logprobs``
alternatives at each of its positions). ``completion_tokens`` counts the
chosen label's tokens (those it takes over from the prompt's end included).

Cost, on the worker's generic scoring (only this module knows about choices): the row's
request is its prompt up to where the labels start, ``score_only``, with each label's first
token as a ``target_token_ids`` entry: one prefill, whose last logits score every label's
first token (single-token labels cost nothing more). When it has run, one ``score_only``
request per label of two or more tokens (that prompt plus the label, ``num_scored_tokens``
= the label's length - 1) forks its blocks (copy-on-write of the partial last block, which
is therefore not computed again) and computes the label's tokens; beyond ``max_num_seqs``
such requests wait and read the prompt's full blocks from the prefix cache instead. The
model runner returns each scored token's log-probability; they are kept per position, so a
recompute after preemption does not count twice.

The engine calls :meth:`ChoiceScores.add` (a new choice row), :meth:`~ChoiceScores.on_prefilled`
(its prefill ran: the label requests to start) and :meth:`~ChoiceScores.on_step` (a step's
scores; the outputs of the rows they complete). A question of a question group is a choice
row whose scores go to its group (``add``'s ``done``) instead of becoming sample outputs
(:mod:`mlxpa.engine.question_scores`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mlxpa.core.scheduler import SchedulerOutput
from mlxpa.messages import quote_value
from mlxpa.request import LabelScores, Request, RequestStatus, SampleOutput, TokenLogprob
from mlxpa.sampling_params import SamplingParams, StructuredOutput
from mlxpa.structured.labels import LabelJoiner, LabelTokens, source_name
from mlxpa.worker.outputs import StepResult
from mlxpa.worker.topk_topp_sampler import sample_one


@dataclass(slots=True)
class _Row:
    row: Request  # as the engine made it: the whole prompt, the params, the ids
    prefill: Request
    labels: tuple[str, ...]
    tokens: tuple[tuple[int, ...], ...]  # per label, from prefill.num_prompt_tokens
    values: list[dict[int, TokenLogprob]]  # per label, prompt position to its value
    left: int  # the row's requests (prefill, labels) not finished
    done: Callable[[LabelScores | str], list[SampleOutput]] | None = None  # scores' taker


def is_choice(params: SamplingParams) -> bool:
    """Whether a request with ``params`` is a ``choice`` row (scored here)."""
    return (params.structured_outputs is not None
            and params.structured_outputs.kind == "choice")


def choose_label(scores: Sequence[float], params: SamplingParams, seed: int) -> int:
    """The index of the label a sample of a choice row takes.

    Args:
        scores: ``[L]`` each label's log-probability.
        params: The row's sampling parameters.
        seed: The sample's seed.

    Returns:
        The first highest-scoring label at temperature 0; otherwise a draw from
        ``softmax(scores / temperature)`` after ``top_p`` / ``min_p`` / ``top_k`` over the
        labels (:func:`mlxpa.worker.topk_topp_sampler.sample_one`: the sampler's filters,
        keyed by ``seed`` and output position 0).
    """
    if params.greedy:
        return max(range(len(scores)), key=scores.__getitem__)
    return sample_one(list(scores), params, seed, 0)


def _label_scores(state: _Row) -> LabelScores:
    """A row's scores, each label's the sum of its tokens' values."""
    scores = [sum(v.logprob for v in by_pos.values()) for by_pos in state.values]
    probs, outside = label_probs(scores, state.tokens)
    return LabelScores(dict(zip(state.labels, scores)), dict(zip(state.labels, probs)), outside)


def label_probs(scores: Sequence[float], tokens: Sequence[Sequence[int]]
                ) -> tuple[list[float], float]:
    """``(choice_probs, choice_outside_prob)`` of a row's label scores (float64).

    Args:
        scores: ``[L]`` each label's log-probability.
        tokens: Each label's tokens (a label whose tokens extend another label's tokens is
            inside that label's event and is not counted again in the outside mass).

    Returns:
        ``softmax(scores)``, and ``1 - sum(exp(score))`` over the labels that extend no
        other label, clipped at 0.
    """
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    probs = [w / total for w in weights]
    inside = sum(math.exp(s) for s, ids in zip(scores, tokens)
                 if not any(len(o) < len(ids) and tuple(ids[:len(o)]) == tuple(o)
                            for o in tokens))
    return probs, max(0.0, 1.0 - inside)


class ChoiceScores:
    """Engine-side bookkeeping of choice rows: their requests, scores and outputs.

    Args:
        tokenizer: The model's tokenizer (the labels' tokens, a cut label's text).
        max_model_len: Longest prompt + label the scheduler accepts, plus one.
        seed_for: A sample's seed (:meth:`mlxpa.worker.model_runner.ModelRunner.seed_for`).
        output: The engine's :class:`SampleOutput` of a finished request and its text.
    """

    def __init__(self, tokenizer, max_model_len: int, seed_for: Callable[[Request], int],
                 output: Callable[[Request, str], SampleOutput]) -> None:
        self._tok = tokenizer
        self._joiner = LabelJoiner(tokenizer)
        self.max_model_len = max_model_len
        self._seed_for = seed_for
        self._output = output
        self._rows: dict[int, _Row] = {}  # by request key: each of a row's (prefill, labels)
        self._label: dict[int, int] = {}  # a label request's label, by request key

    def add(self, row: Request, schedule: Callable[[Request], None],
            done: Callable[[LabelScores | str], list[SampleOutput]] | None = None) -> Request:
        """A new choice row (all its ``n`` samples): its labels joined to its prompt, and
        its prefill request (the prompt up to where the labels start, ``score_only``, each
        label's first token a target) passed to ``schedule``.

        Args:
            row: The row's request as the engine made it (its ``choice`` constraint).
            schedule: Takes the prefill request (queues it, or keeps it to fork).
            done: When given, the row's scores go to it (its :class:`LabelScores`, or why a
                label could not be scored) instead of becoming the row's sample outputs;
                its return value is what the row releases (a question group's output).

        Returns:
            The prefill request; it waits for :meth:`on_prefilled` when some label has two
            or more tokens (:meth:`waits_for_prefill`).

        Raises:
            ValueError: As :meth:`join`, or ``schedule`` refused the prefill.
        """
        so = row.sampling_params.structured_outputs
        joined = self.join(row.prompt_token_ids, so)
        params = row.sampling_params
        prefill = Request(row.request_id, row.prompt_token_ids[:joined.start], params,
                          arrival_time=row.arrival_time, cache_salt=row.cache_salt,
                          score_only=True, target_token_ids=tuple(t[0] for t in joined.tokens),
                          scored_top_logprobs=params.logprobs or 0)
        schedule(prefill)
        self._rows[prefill.key] = _Row(row, prefill, so.choices, joined.tokens,
                                   [{} for _ in so.choices],
                                   1 + sum(len(t) > 1 for t in joined.tokens), done)
        return prefill

    def join(self, prompt_ids: Sequence[int], so: StructuredOutput) -> LabelTokens:
        """Where the labels of ``so`` start after ``prompt_ids``, and their tokens
        (:class:`~mlxpa.structured.labels.LabelJoiner`).

        Raises:
            ValueError: The labels cannot be scored after this prompt (two are the same
                tokens, one has no token of its own) or a label does not fit the context
                (the messages name the field).
        """
        try:
            joined = self._joiner.join(prompt_ids, so.choices)
        except ValueError as e:
            raise ValueError(f"{source_name(so)}: {e}") from None
        for label, ids in zip(so.choices, joined.tokens):  # a longer label's request fits
            if len(ids) > 1 and joined.start + len(ids) >= self.max_model_len:
                raise ValueError(
                    f"{source_name(so)}: the prompt and label {quote_value(label)} have "
                    f"{joined.start + len(ids)} tokens; the limit is {self.max_model_len - 1}")
        return joined

    def waits_for_prefill(self, prefill: Request) -> bool:
        """Whether ``prefill`` (from :meth:`add`) starts label requests once it has run."""
        state = self._rows.get(prefill.key)
        return state is not None and state.left > 1

    def on_prefilled(self, prefill: Request) -> list[Request]:
        """``prefill``'s prompt is computed: the label requests to start, forking its blocks
        (one per label of two or more tokens, in label order)."""
        state = self._rows[prefill.key]
        starts = []
        for k, ids in enumerate(state.tokens):
            if len(ids) < 2:
                continue
            req = Request(prefill.request_id, prefill.prompt_token_ids + list(ids),
                          SamplingParams(max_tokens=1), arrival_time=prefill.arrival_time,
                          cache_salt=prefill.cache_salt,
                          num_scored_tokens=len(ids) - 1, score_only=True,
                          scored_top_logprobs=prefill.scored_top_logprobs)
            self._rows[req.key], self._label[req.key] = state, k
            starts.append(req)
        return starts

    def __len__(self) -> int:
        """Choice rows in flight."""
        return len({id(state) for state in self._rows.values()})

    def abort(self, request_ids: set[str]) -> None:
        """Forget the rows of ``request_ids`` (the engine finishes their requests)."""
        gone = [k for k, state in self._rows.items() if state.row.request_id in request_ids]
        for key in gone:
            del self._rows[key]
            self._label.pop(key, None)

    def on_step(self, out: SchedulerOutput, result: StepResult) -> list[SampleOutput]:
        """Record a step's scores (after ``update_from_output``): each label's first token
        (the prefills' ``targets``) and the label requests' tokens (``scored``).

        Returns:
            The outputs (one per sample) of the rows whose scores are now complete.
        """
        ran = {r.key: r for r in out.requests}
        for key, values in result.targets.items():
            state = self._rows.get(key)
            if state is not None:
                for by_pos, value in zip(state.values, values):
                    by_pos[ran[key].num_prompt_tokens] = value
        for key, by_pos in result.scored.items():
            k = self._label.get(key)
            if k is not None:
                self._rows[key].values[k].update(by_pos)
        released = []
        for req in out.requests:
            state = self._rows.get(req.key) if req.is_finished else None
            if state is None:
                continue
            del self._rows[req.key]
            self._label.pop(req.key, None)
            state.left -= 1
            if state.left == 0:
                released.extend(self._release(state))
        return released

    def _release(self, state: _Row) -> list[SampleOutput]:
        """The outputs of a row whose requests all finished (a ``done`` row's: what its
        taker returns)."""
        row, params, start = state.row, state.row.sampling_params, state.prefill.num_prompt_tokens
        missing = [label for label, ids, by_pos in zip(state.labels, state.tokens, state.values)
                   if len(by_pos) != len(ids)]
        why = f"label {quote_value(missing[0])} could not be scored" if missing else None
        if state.done is not None:
            return state.done(why if missing else _label_scores(state))
        samples = [Request(row.request_id, row.prompt_token_ids, params,
                           arrival_time=row.arrival_time, sample_index=i,
                           num_cached_tokens=state.prefill.num_cached_tokens,
                           cache_salt=row.cache_salt)
                   for i in range(params.n)]
        if missing:  # never seen: every request of the row ran to its end
            for sample in samples:
                sample.status = RequestStatus.FINISHED_ABORTED
                sample.stop_reason = why
            return [self._output(sample, "") for sample in samples]
        scores = _label_scores(state)
        outs, now = [], time.perf_counter()
        for sample in samples:
            k = choose_label(list(scores.logprobs.values()), params, self._seed_for(sample))
            ids = state.tokens[k]
            m = min(len(ids), params.max_tokens)
            sample.output_token_ids = list(ids[:m])
            sample.logprobs = [state.values[k][start + j] for j in range(m)]
            sample.token_times = [now]
            sample.status = (RequestStatus.FINISHED_STOPPED if m == len(ids)
                             else RequestStatus.FINISHED_LENGTH_CAPPED)
            text = state.labels[k] if m == len(ids) else self._cut(ids, m, state.labels[k])
            out = self._output(sample, text)
            out.choice_logprobs, out.choice_probs = scores.logprobs, scores.probs  # shared
            out.choice_outside_prob = scores.outside_prob
            outs.append(out)
        return outs

    def _cut(self, ids: Sequence[int], m: int, label: str) -> str:
        """The text of a label's first ``m`` tokens, without the characters the label took
        over from the prompt's end (an incomplete last character dropped)."""
        if m == 0:
            return ""
        full = self._tok.decode(list(ids))
        joined = len(full) - len(label) if full.endswith(label) else 0
        return self._tok.decode(list(ids[:m])).rstrip("\ufffd")[joined:]
