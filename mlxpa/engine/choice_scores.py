"""``choice_logprobs``: the log-probability of every choice of a ``choice`` row, given its prompt.

Definition: for choice ``c`` with tokens ``t_1..t_k = tokenizer.encode(c,
add_special_tokens=False)`` (the choice tokenized on its own, appended right after the prompt's
tokens), ``choice_logprobs[c] = sum_j log p(t_j | prompt, t_1..t_{j-1})``, teacher-forced, with
the model's raw log-softmax (no temperature, no mask). It is the probability that the model
writes exactly those tokens next, not that it stops after them; it does not add other
tokenizations of the same text. When no choice's tokens are a prefix of another's, these are
disjoint events, so ``sum(exp(v)) <= 1``.

Mechanics: every choice's first token is scored from the logits of the row's own first sampled
token (no extra work: single-token labels cost nothing). Once the row's prefill has run, the
engine adds one scoring request per choice of two or more tokens (prompt + choice tokens,
``max_tokens`` 1, ``num_scored_tokens`` = the choice's length - 1). Its prompt's full blocks are
prefix-cache hits on the row's own blocks, so such a choice costs about one decode step per
further token plus the prompt's partial last block. The model runner reads the
logits before each scored token (:func:`mlxpa.worker.logprobs.score_columns`) and the engine
sums them here (per position, so a recompute after preemption does not count twice).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlxpa.config import SamplingParams
from mlxpa.request import Request, RequestOutput


@dataclass(slots=True)
class _Pending:
    choices: tuple[str, ...]
    by_choice: list[dict[int, float]]
    left: int
    held: list[RequestOutput] = field(default_factory=list)


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

    def wants(self, req: Request) -> bool:
        """Whether ``req`` (sample 0) is a choice row whose choices must be scored."""
        so = req.sampling_params.structured
        return so is not None and so.kind == "choice" and req.sample_index == 0

    def is_scorer(self, req: Request) -> bool:
        return req in self._scorer

    def _choice_tokens(self, so) -> list[list[int]]:
        if so not in self._tokens:
            self._tokens[so] = [list(self._tok.encode(c, add_special_tokens=False))
                                for c in so.choices]
        return self._tokens[so]

    def first_tokens(self, so) -> tuple[int, ...]:
        """The first token of each choice of ``so`` (a ``choice`` constraint)."""
        return tuple(ids[0] for ids in self._choice_tokens(so))

    def start(self, parent: Request) -> list[Request]:
        """The scoring requests of ``parent`` (one per choice of two or more tokens) to add to
        the scheduler."""
        so = parent.sampling_params.structured
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

    def record_first(self, parent: Request, values: list[float]) -> None:
        """Log-probabilities of each choice's first token, after ``parent``'s prompt."""
        pend = self._pending.get(parent)
        if pend is not None:
            for by_pos, v in zip(pend.by_choice, values):
                by_pos[parent.num_prompt_tokens] = v

    def add_child(self, parent: Request, child: Request) -> None:
        """``child`` is another sample of ``parent``: its output waits for the same scores."""
        if parent in self._pending:
            self._family[child] = parent

    def record(self, scorer: Request, position: int, logprob: float) -> None:
        """The scored log-probability of ``scorer``'s token at ``position``."""
        parent, k = self._scorer[scorer]
        self._pending[parent].by_choice[k][position] = logprob

    def finished(self, scorer: Request) -> list[RequestOutput]:
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

    def hold(self, req: Request, out: RequestOutput) -> list[RequestOutput]:
        """Outputs to emit now for ``req``'s finished ``out`` (held until its scores exist)."""
        parent = self._family.pop(req, req)
        pend = self._pending.get(parent)
        if pend is None:
            return [out]
        pend.held.append(out)
        return self._release(parent)

    def _release(self, parent: Request) -> list[RequestOutput]:
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
