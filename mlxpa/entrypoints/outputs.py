"""What :class:`~mlxpa.entrypoints.llm.LLM` returns, in vLLM's names and shapes
(``vllm.outputs.RequestOutput`` / ``CompletionOutput``, ``vllm.logprobs.Logprob``), plus
mlxpa's ``choice_logprobs``, ``choice_probs`` and ``choice_outside_prob`` (choice rows) and
``error`` (a prompt that could not run); and what :meth:`LLM.annotate` returns per document
(:class:`AnnotationOutput`: one :class:`QuestionAnswer` per question). No mlx.

    Finished(PromptRequest, [SampleOutput × n])  ──►  RequestOutput(request_id, prompt,
                            prompt_token_ids, outputs=[CompletionOutput(index=0..n-1, ...)])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlxpa.request import SampleOutput, TokenLogprob

if TYPE_CHECKING:
    from mlxpa.engine.stream import Finished
    from mlxpa.entrypoints.prompts import PromptRequest

Decode = Callable[[list[int]], str]  # token ids to text (the tokenizer's decode)

# Per generated token, its log-probability entries by token id (vLLM's ``SampleLogprobs``).
SampleLogprobs = list[dict[int, "Logprob"]]


@dataclass(slots=True)
class Logprob:
    """One token's entry in a position's log-probabilities (vLLM's ``Logprob``).

    Attributes:
        logprob: The model's log-probability of the token (natural log, the raw
            log-softmax before any sampling filter: vLLM's default ``raw_logprobs``).
        rank: 1 for the most likely token: how many tokens are at least as likely.
        decoded_token: The token's text.
    """

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass(slots=True)
class CompletionOutput:
    """One sample of a prompt (vLLM's ``CompletionOutput``).

    Attributes:
        index: Which of the prompt's ``n`` samples (0-based).
        text: The generated text (a stop string not included unless
            ``include_stop_str_in_output``).
        token_ids: The generated token ids.
        cumulative_logprob: The sum of the generated tokens' log-probabilities when
            ``SamplingParams.logprobs`` is set, else None (as vLLM).
        logprobs: With ``SamplingParams.logprobs = k``: per generated token, a dict of token
            id to :class:`Logprob` holding the generated token and the ``k`` most likely
            (``k`` or ``k + 1`` entries); else None.
        finish_reason: ``stop`` (EOS, a stop string or token id, a completed constraint),
            ``length`` (``max_tokens`` or the context), ``abort`` (the sample failed: the
            request's ``error`` says why).
        stop_reason: The stop string or stop token id that ended the sample; None for EOS and
            every other end.
        choice_logprobs: mlxpa's, for a ``choice`` constraint: each choice's total
            log-probability given the prompt (their exponentials are the labels'
            probabilities); else None.
        choice_probs: mlxpa's, for a ``choice`` constraint: the labels' probabilities
            normalised over the labels (``softmax`` of ``choice_logprobs``; they sum to 1),
            the distribution the label is drawn from at temperature 1; else None.
        choice_outside_prob: mlxpa's, for a ``choice`` constraint: the model's probability
            of writing none of the labels after the prompt; else None.
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    choice_logprobs: dict[str, float] | None = None
    choice_probs: dict[str, float] | None = None
    choice_outside_prob: float | None = None

    def finished(self) -> bool:
        """True once the sample has a finish reason (always, in an offline result)."""
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    """The result of one prompt (vLLM's ``RequestOutput``).

    Attributes:
        request_id: The prompt's id as text: a dict row's ``id``, else its index in the call.
        prompt: The text prompt; for chat messages, the prompt as the template rendered it
            (decoded from its token ids); None for a token-id prompt.
        prompt_token_ids: The prompt's token ids (None when it could not be tokenized).
        prompt_logprobs: With ``SamplingParams.prompt_logprobs = k`` (or a row's field), vLLM's
            prompt log-probabilities: None for the first prompt token (nothing precedes it),
            then per prompt token a dict of token id to :class:`Logprob` holding the token and
            the ``k`` most likely there (raw log-softmax given the tokens before it); else
            None.
        outputs: The ``n`` samples in ``index`` order; empty when the prompt did not run.
        finished: True (offline results are finished).
        num_cached_tokens: Prompt tokens read from the prefix cache instead of computed.
        error: mlxpa's: why the prompt could not run or a sample failed (naming
            ``prompts[i]``), else None. Other prompts are never affected.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int | None = None
    error: str | None = None


def request_output(result: Finished[PromptRequest], decode: Decode,
                   place: str) -> RequestOutput:
    """The :class:`RequestOutput` of one prompt done by the streaming core.

    Args:
        result: The prompt with its request (None if it did not run) and its samples'
            outputs.
        decode: The tokenizer's decode (a chat prompt's ``prompt``, ``decoded_token``).
        place: Where the prompt was given (``prompts[3]``), put before a sample's error.
    """
    item, outs = result.item, result.outputs
    ids = item.request.prompt_token_ids if item.request is not None else None
    prompt = decode(ids) if item.chat and ids is not None else item.prompt
    error = item.error or next(
        (f"{place}: {o.error}" for o in outs if o.error is not None), None)
    prompt_logprobs = None
    if outs and outs[0].prompt_logprobs is not None:  # the prompt's samples share one list
        prompt_logprobs = [None if lp is None else position_logprobs(lp, decode)
                           for lp in outs[0].prompt_logprobs]
    return RequestOutput(
        request_id=item.request_id, prompt=prompt, prompt_token_ids=ids,
        prompt_logprobs=prompt_logprobs,
        outputs=[completion_output(o, decode) for o in outs], finished=True,
        num_cached_tokens=outs[0].num_cached_tokens if outs else None, error=error)


def completion_output(out: SampleOutput, decode: Decode) -> CompletionOutput:
    """vLLM's :class:`CompletionOutput` of one sample's engine output."""
    logprobs = None
    if out.logprobs is not None:
        logprobs = [position_logprobs(lp, decode) for lp in out.logprobs]
    return CompletionOutput(
        index=out.sample_index, text=out.text, token_ids=list(out.token_ids),
        cumulative_logprob=(sum(lp.logprob for lp in out.logprobs)
                            if out.logprobs is not None else None),
        logprobs=logprobs, finish_reason=out.finish_reason, stop_reason=out.stop_reason,
        choice_logprobs=out.choice_logprobs, choice_probs=out.choice_probs,
        choice_outside_prob=out.choice_outside_prob)


def position_logprobs(lp: TokenLogprob, decode: Decode) -> dict[int, Logprob]:
    """One position's entries (vLLM's shape): the generated (or prompt) token with its rank,
    then the most likely tokens ranked 1, 2, ... (the token among them keeps one entry)."""
    entries = {lp.token_id: Logprob(lp.logprob, lp.rank, decode([lp.token_id]))}
    for rank, (token_id, value) in enumerate(lp.top, 1):
        entries[token_id] = Logprob(value, rank, decode([token_id]))
    return entries


@dataclass(slots=True)
class AnnotationOutput:
    """The answers about one document (:meth:`LLM.annotate`; not vLLM's classification
    output, whose ``outputs.probs`` are a classification head's).

    Attributes:
        request_id: The document's id as text: a dict row's ``id``, else its index.
        prompt: The document as given (a text), or None (messages).
        prompt_token_ids: The document's tokens: the longest token prefix its questions'
            prompts share (None when it could not run).
        outputs: Question name to its :class:`QuestionAnswer`, in the question set's order;
            empty when the document could not run.
        label_order_changed: With ``permute_labels``: the questions whose answer changed
            with their labels listed in reverse; else None.
        finished: True (offline results are finished).
        num_cached_tokens: Document tokens read from the prefix cache.
        error: Why the document could not run (naming ``documents[i]``), else None.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    outputs: dict[str, QuestionAnswer]
    label_order_changed: list[str] | None = None
    finished: bool = True
    num_cached_tokens: int | None = None
    error: str | None = None


@dataclass(slots=True)
class QuestionAnswer:
    """One question's answer about a document (an ``answers`` entry of ``mlxpa run``).

    Attributes:
        label: The label of highest ``probs`` (the first on a tie): answers are never sampled.
        probs: Label to probability over the labels, summing to 1: calibrated when the call
            has a calibration for the question, else ``softmax(logprobs)``. Threshold
            ``probs[label]`` of a calibrated answer (``docs/annotation.md``).
        logprobs: Label to its raw log-probability after the question (teacher-forced).
        outside_prob: The model's raw probability of writing none of the labels.
        calibrated: Whether ``probs`` are calibrated.
        expected: A ``scale`` question's ``sum(probs[c] * value(c))``; else None.
        permuted_label: With ``permute_labels``, for a question whose template lists its
            labels: its label with them listed in reverse; else None.
    """

    label: str
    probs: dict[str, float]
    logprobs: dict[str, float]
    outside_prob: float
    calibrated: bool
    expected: float | None = None
    permuted_label: str | None = None
