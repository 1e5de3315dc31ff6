"""``choice_logprobs``: the log-probability of every choice of a ``choice`` row, given its prompt.

Definition: for choice ``c`` with tokens ``t_1..t_k = tokenizer.encode(c,
add_special_tokens=False)`` (the choice tokenized on its own, appended right after the prompt's
tokens), ``choice_logprobs[c] = sum_j log p(t_j | prompt, t_1..t_{j-1})``, teacher-forced, with
the model's raw log-softmax (no temperature, no mask). It is the probability that the model
writes exactly those tokens next, not that it stops after them; it does not add other
tokenizations of the same text. When no choice's tokens are a prefix of another's, these are
disjoint events, so ``sum(exp(v)) <= 1``.

Mechanics, on the worker's generic scoring (only this module knows about choices): every
choice's first token is a ``target_token_ids`` entry of the row, scored from the logits of its
own first sampled token (no extra work: single-token labels cost nothing). Once the row's
prefill has run, one scoring request per choice of two or more tokens is added (prompt + choice
tokens, ``max_tokens`` 1, ``num_scored_tokens`` = the choice's length - 1). Its prompt's full
blocks are prefix-cache hits on the row's own blocks, so such a choice costs about one decode
step per further token plus the prompt's partial last block. The model runner returns the
log-probability of each scored token (:func:`mlxpa.worker.logprobs.score_columns`) and they
are summed here (per position, so a recompute after preemption does not count twice).

The engine calls :meth:`ChoiceScores.on_add` (a new request), :meth:`~ChoiceScores.on_prefilled`
(its prefill ran: the scoring requests to queue), :meth:`~ChoiceScores.on_step` (a step's
scores; the scoring requests' own tokens taken out) and :meth:`~ChoiceScores.hold` (a finished
output waits for its row's scores).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlxpa.config import SamplingParams
from mlxpa.request import Request, SampleOutput
from mlxpa.worker.outputs import StepResult


@dataclass(slots=True)
class _Pending:
    choices: tuple[str, ...]
    by_choice: list[dict[int, float]]
    left: int
    held: list[SampleOutput] = field(default_factory=list)


def _is_choice_row(req: Request) -> bool:
    """Whether ``req`` is sample 0 of a ``choice`` row (its choices are scored)."""
    so = req.sampling_params.structured_outputs
    return so is not None and so.kind == "choice" and req.sample_index == 0


class ChoiceScores:
    """Engine-side bookkeeping of the scoring requests of choice rows.

    Args:
        tokenizer: The model's tokenizer (``encode``).

    Attributes:
        num_cached_tokens: Prompt tokens of finished scoring requests served from the
            prefix cache (the choice rows' own blocks).
    """

    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer
        self._pending: dict[Request, _Pending] = {}
        self._scorer: dict[Request, tuple[Request, int]] = {}
        self._family: dict[Request, Request] = {}
        self._tokens: dict[object, list[list[int]]] = {}
        self.num_cached_tokens = 0

    def on_add(self, req: Request) -> bool:
        """A new request: a choice row (sample 0) gets each choice's first token as its
        ``target_token_ids``.

        Returns:
            Whether its scoring requests start once its prefill has run
            (:meth:`on_prefilled`).
        """
        if not _is_choice_row(req):
            return False
        so = req.sampling_params.structured_outputs
        req.target_token_ids = tuple(ids[0] for ids in self._choice_tokens(so))
        return True

    def _choice_tokens(self, so) -> list[list[int]]:
        if so not in self._tokens:
            self._tokens[so] = [list(self._tok.encode(c, add_special_tokens=False))
                                for c in so.choices]
        return self._tokens[so]

    def on_prefilled(self, parent: Request, children: list[Request]) -> list[Request]:
        """``parent``'s prefill has run; ``children`` are its other samples (their outputs
        wait for the same scores).

        Returns:
            The scoring requests to queue (one per choice of two or more tokens); none
            unless :meth:`on_add` returned True for ``parent``.
        """
        if not _is_choice_row(parent):
            return []
        so = parent.sampling_params.structured_outputs
        for child in children:
            self._family[child] = parent
        pend = _Pending(so.choices, [{} for _ in so.choices], 0)
        self._pending[parent] = pend
        scorers = []
        for k, ids in enumerate(self._choice_tokens(so)):
            if len(ids) < 2:
                continue
            req = Request(parent.request_id, parent.prompt_token_ids + ids,
                          SamplingParams(max_tokens=1), arrival_time=parent.arrival_time,
                          num_scored_tokens=len(ids) - 1)
            self._scorer[req] = (parent, k)
            scorers.append(req)
        pend.left = len(scorers)
        return scorers

    def on_step(self, result: StepResult,
                updated: list[Request]) -> tuple[list[Request], list[SampleOutput]]:
        """Record a step's scores: each choice's first token (the rows' ``targets``) and the
        scoring requests' tokens (``scored``).

        Args:
            result: The step's result.
            updated: The requests that received a token in the step.

        Returns:
            ``(updated without the scoring requests, outputs the finished scoring requests
            completed)``.
        """
        for parent, values in result.targets.items():
            pend = self._pending.get(parent)
            if pend is not None:
                for by_pos, v in zip(pend.by_choice, values):
                    by_pos[parent.num_prompt_tokens] = v
        for scorer, by_pos in result.scored.items():
            if scorer in self._scorer:
                parent, k = self._scorer[scorer]
                self._pending[parent].by_choice[k].update(
                    (p, lp.logprob) for p, lp in by_pos.items())
        own, released = [], []
        for req in updated:
            if req not in self._scorer:
                own.append(req)
            elif req.is_finished:
                released.extend(self.finished(req))
        return own, released

    def finished(self, scorer: Request) -> list[SampleOutput]:
        """``scorer`` is done (or could not run); returns outputs that became complete."""
        parent, k = self._scorer.pop(scorer)
        self.num_cached_tokens += max(scorer.num_cached_tokens, 0)
        pend = self._pending[parent]
        if (scorer.finish_reason == "abort"
                or len(pend.by_choice[k]) != scorer.num_scored_tokens + 1):
            pend.by_choice[k] = {}  # not scored: reported as null
            pend.by_choice[k][-1] = float("nan")
        pend.left -= 1
        return self._release(parent)

    def hold(self, req: Request, out: SampleOutput) -> list[SampleOutput]:
        """Outputs to emit now for ``req``'s finished ``out`` (held until its scores exist)."""
        parent = self._family.pop(req, req)
        pend = self._pending.get(parent)
        if pend is None:
            return [out]
        pend.held.append(out)
        return self._release(parent)

    def _release(self, parent: Request) -> list[SampleOutput]:
        pend = self._pending[parent]
        n = parent.sampling_params.n
        if pend.left or len(pend.held) < n:
            return []
        del self._pending[parent]
        scores = {}
        for c, by_pos in zip(pend.choices, pend.by_choice):
            total = sum(by_pos.values())
            scores[c] = None if total != total or not by_pos else total  # NaN: not scored
        for out in pend.held:
            out.choice_logprobs = scores
        return pend.held
