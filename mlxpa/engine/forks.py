"""Requests that start from another request's prefill: samples 1..n-1 of a request
(vLLM's parallel sampling), a choice row's label requests, a question group's questions.
Each parent waits here until the step that runs its last prompt chunk; its children then
join the scheduler sharing its blocks (``Scheduler.add_samples``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mlxpa.core.scheduler import Scheduler, SchedulerOutput
from mlxpa.engine.choice_scores import ChoiceScores
from mlxpa.engine.question_scores import QuestionScores
from mlxpa.request import Request


class Forks:
    """The parents whose children fork when their prefill has run.

    Args:
        scheduler: Where children are added; told how far each parent's prefill goes
            (``expect_forks``: another sample forks at the last prompt token, a scoring
            request at the prompt's end, where a recurrent state is kept).
        choice_scores: Makes a choice row's label requests.
        question_scores: Makes a question group's questions (and their own prefills).
        on_sample: Called with each new sample of an ``n > 1`` request (its detokenizer).
    """

    def __init__(self, scheduler: Scheduler, choice_scores: ChoiceScores,
                 question_scores: QuestionScores,
                 on_sample: Callable[[Request], None]) -> None:
        self.scheduler = scheduler
        self.choice_scores = choice_scores
        self.question_scores = question_scores
        self.on_sample = on_sample
        self.parents: list[Request] = []

    def __bool__(self) -> bool:
        return bool(self.parents)

    def expect(self, parents: Iterable[Request]) -> None:
        """Children will fork from each of ``parents`` when its prefill has run."""
        for parent in parents:
            self.parents.append(parent)
            self.scheduler.expect_forks(parent, parent.num_prompt_tokens - (
                0 if parent.score_only else 1))

    def on_step(self, out: SchedulerOutput) -> None:
        """Fork the children of every parent whose last prompt chunk ran in step ``out``
        (before ``update_from_output``, which finishes and frees a choice row's prefill)."""
        done = {r.key for r, last in zip(out.requests, out.last_chunk) if last}
        still, pending, self.parents = [], self.parents, []
        for parent in pending:
            if parent.key not in done:
                still.append(parent)
                continue
            if self.question_scores.owns(parent):  # a question group's document
                children, waiting = self.question_scores.on_prefilled(parent)
                self.expect(waiting)
            elif parent.score_only:  # a choice row's prefill
                children = self.choice_scores.on_prefilled(parent)
            else:
                children = [Request(parent.request_id, parent.prompt_token_ids,
                                    parent.sampling_params, arrival_time=parent.arrival_time,
                                    sample_index=i, cache_salt=parent.cache_salt,
                                    prompt_logprobs=parent.prompt_logprobs)  # computed once
                            for i in range(1, parent.sampling_params.n)]
                for child in children:
                    self.on_sample(child)
            self.scheduler.add_samples(parent, children)
        self.parents = still + self.parents  # and the documents' questions

    def abort(self, request_ids: set[str]) -> None:
        """Forget the parents of ``request_ids``."""
        self.parents = [r for r in self.parents if r.request_id not in request_ids]
