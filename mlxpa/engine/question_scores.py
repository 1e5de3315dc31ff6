"""Question groups: a document's questions scored over one prefill of the document.

A group's request carries its questions (:class:`~mlxpa.request.QuestionPrompt`: each the
document's tokens, then the question's suffix, and its labels). The document is the longest
common token prefix of the questions' prompts, so a chat template's rendering of each question
(the conversation's tokens, then the question's turn) shares its tokens with no per-template
code; it is cut so that every question's choice prefill (its prompt up to where its labels
start: :mod:`mlxpa.structured.labels`) still computes a token of its own, whose logits score
its labels' first tokens::

    document: one score_only request (no targets: no logits, K/V only)
      ─► its prefill has run: each question's choice prefill forks its blocks
         (Scheduler.add_samples; past max_num_seqs they wait and read the document's full
         blocks from the prefix cache instead)
      ─► each question's labels, as a choice row's (mlxpa.engine.choice_scores)
      ─► every question scored: one SampleOutput for the group, question_scores in order

With one question, or a document shorter than one token, no document request runs: each
question is a choice row of its own. Every request of a group carries the group's request id,
so aborting the id drops them all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mlxpa.engine.choice_scores import ChoiceScores
from mlxpa.request import (
    LabelScores,
    QuestionPrompt,
    Request,
    RequestStatus,
    SampleOutput,
    common_prefix,
)
from mlxpa.sampling_params import SamplingParams, StructuredOutput


@dataclass(slots=True)
class _Group:
    row: Request  # the group's request as the engine made it (the document's tokens)
    questions: tuple[Request, ...]  # each question's choice row
    scores: list[LabelScores | None]
    document: Request | None  # the document's score_only request, while it has not forked
    num_prompt_tokens: int  # the document's tokens, then each question's own
    first: Request | None = None  # the request whose prefix-cache hit the output reports
    error: str | None = None
    left: int = 0


class QuestionScores:
    """Engine-side bookkeeping of question groups over :class:`ChoiceScores`.

    Args:
        choices: The engine's choice rows' bookkeeping (scores each question).
        output: The engine's :class:`SampleOutput` of a finished request and its text.
    """

    def __init__(self, choices: ChoiceScores,
                 output: Callable[[Request, str], SampleOutput]) -> None:
        self._choices = choices
        self._output = output
        self._groups: dict[int, _Group] = {}  # a document request's key -> its group
        self._live: dict[str, _Group] = {}  # request id -> its group, until released

    def add(self, row: Request, questions: Sequence[QuestionPrompt],
            schedule: Callable[[Request], None]) -> list[Request]:
        """A new group: every question's labels joined to its prompt, then the document's
        request (or, with no document, each question's choice prefill) passed to
        ``schedule``.

        Args:
            row: The group's request (its id and arrival time; its own tokens are not read:
                the document is the questions' common prefix).
            questions: Each question's prompt and labels, in order (at least one).
            schedule: Queues a request.

        Returns:
            The requests that wait for their prefill before others start from them (the
            engine forks those: :meth:`on_prefilled`, or a choice prefill's labels).

        Raises:
            ValueError: No question, or a question's labels cannot be scored after its prompt
                (naming ``questions[i].labels``); nothing is scheduled then.
        """
        if not questions:
            raise ValueError("a question group needs at least one question")
        rows = tuple(Request(row.request_id, list(q.prompt_token_ids), _params(i, q.labels),
                             arrival_time=row.arrival_time, cache_salt=row.cache_salt)
                     for i, q in enumerate(questions))
        starts = []
        for i, r in enumerate(rows):
            start = self._choices.join(r.prompt_token_ids,
                                       r.sampling_params.structured_outputs).start
            if start >= self._choices.max_model_len:
                raise ValueError(f"questions[{i}]: the prompt has {start} tokens before its "
                                 f"labels; the limit is {self._choices.max_model_len - 1}")
            starts.append(start)
        prompts = [r.prompt_token_ids for r in rows]
        shared = min(common_prefix(prompts), min(starts) - 1)
        total = shared + sum(len(p) - shared for p in prompts)
        group = _Group(row, rows, [None] * len(rows), None, total, left=len(rows))
        if len(rows) == 1 or shared < 1:
            waiting = self._start(group, schedule)
        else:
            group.document = group.first = Request(
                row.request_id, prompts[0][:shared], SamplingParams(max_tokens=1),
                arrival_time=row.arrival_time, score_only=True, cache_salt=row.cache_salt)
            schedule(group.document)
            self._groups[group.document.key] = group
            waiting = [group.document]
        self._live[row.request_id] = group
        return waiting

    def num_prompt_tokens(self, request_id: str) -> int:
        """The prompt tokens of the group in flight under ``request_id``: the document's,
        then each question's own."""
        return self._live[request_id].num_prompt_tokens

    def owns(self, request: Request) -> bool:
        """Whether ``request`` is a group's document request (from :meth:`add`)."""
        return request.key in self._groups

    def on_prefilled(self, document: Request) -> tuple[list[Request], list[Request]]:
        """``document``'s prefill has run: its questions' choice prefills, to fork its
        blocks.

        Returns:
            ``(children, waiting)``: the prefills to start from the document's blocks, in
            question order, and those of them that wait for their own prefill (labels of
            two or more tokens).
        """
        group = self._groups.pop(document.key)
        children: list[Request] = []
        return children, self._start(group, children.append)

    def _start(self, group: _Group, schedule: Callable[[Request], None]) -> list[Request]:
        """Each question's choice row; returns the prefills that wait for label forks."""
        waiting = []
        for k, q in enumerate(group.questions):
            prefill = self._choices.add(q, schedule, self._taker(group, k))
            group.first = group.first or prefill
            if self._choices.waits_for_prefill(prefill):
                waiting.append(prefill)
        return waiting

    def _taker(self, group: _Group, k: int) -> Callable[[LabelScores | str], list[SampleOutput]]:
        def done(scores: LabelScores | str) -> list[SampleOutput]:
            if isinstance(scores, str):
                group.error = group.error or f"questions[{k}]: {scores}"
            else:
                group.scores[k] = scores
            group.left -= 1
            return self._release(group) if group.left == 0 else []
        return done

    def _release(self, group: _Group) -> list[SampleOutput]:
        """The group's one output (every question scored, or the first error)."""
        self._live.pop(group.row.request_id, None)
        row = group.row
        req = Request(row.request_id, row.prompt_token_ids, row.sampling_params,
                      arrival_time=row.arrival_time, cache_salt=row.cache_salt,
                      num_cached_tokens=group.first.num_cached_tokens if group.first else 0)
        req.status = RequestStatus.FINISHED_STOPPED
        if group.error is not None:
            req.status, req.stop_reason = RequestStatus.FINISHED_ABORTED, group.error
        out = self._output(req, "")
        out.num_prompt_tokens = group.num_prompt_tokens
        if group.error is None:
            out.question_scores = list(group.scores)
        return [out]

    def abort(self, request_ids: set[str]) -> None:
        """Forget the groups of ``request_ids`` (the engine finishes their requests)."""
        for request_id in request_ids & self._live.keys():
            group = self._live.pop(request_id)
            if group.document is not None:
                self._groups.pop(group.document.key, None)

    def __len__(self) -> int:
        """Groups in flight."""
        return len(self._live)


_PARAMS: dict[tuple[int, tuple[str, ...]], SamplingParams] = {}


def _params(index: int, labels: tuple[str, ...]) -> SamplingParams:
    """A question's choice row parameters: greedy, its labels (named ``questions[i].labels``
    in messages), cached by labels."""
    key = (index, tuple(labels))
    params = _PARAMS.get(key)
    if params is None:
        if len(_PARAMS) > 4096:
            _PARAMS.clear()
        so = StructuredOutput.of_labels(labels, f"questions[{index}].labels")
        params = _PARAMS[key] = SamplingParams(max_tokens=1, structured_outputs=so)
    return params
