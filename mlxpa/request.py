"""The engine's request types: what a caller hands the engine (:class:`EngineRequest`), the
request's state while it runs (:class:`Request`, status an ordered IntEnum) and what the engine
returns per sample (:class:`SampleOutput`).

Follows vLLM v1's ``EngineCoreRequest``, ``Request`` / ``RequestStatus``:
``num_computed_tokens`` counts tokens whose K/V are in the pool, so chunked prefill, decode and
recompute after preemption are one code path (the scheduler schedules
``num_tokens - num_computed_tokens`` tokens).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from mlxpa.messages import field_error_text
from mlxpa.sampling_params import SamplingParams

# Request keys: unique in the process, in creation order (the side tables' keys).
_KEYS = itertools.count()

# The longest ``cache_salt`` (characters): a secret of 128 bits or more fits many times over
# (a UUID is 36, a SHA-512 hex digest 128), and every namespace of the prefix cache and every
# message about a salt stays small.
MAX_CACHE_SALT_CHARS = 256
CACHE_SALT_RULE = f"a non-empty string of at most {MAX_CACHE_SALT_CHARS} characters"


def cache_salt_problem(value: object, field: str = "cache_salt") -> str | None:
    """Why ``value`` cannot be a ``cache_salt`` (vLLM's field: only requests with the same
    salt share prefix-cache blocks), or None: a string of 1 to :data:`MAX_CACHE_SALT_CHARS`
    characters, or None (unsalted). A string is never quoted back (a salt is a secret): its
    length is.

    Returns:
        ``field "<field>" must be a non-empty string of at most 256 characters, got ...``,
        or None.
    """
    if value is None or isinstance(value, str) and 0 < len(value) <= MAX_CACHE_SALT_CHARS:
        return None
    if isinstance(value, str):
        got = '""' if not value else f"a string of {len(value)} characters"
        return f'field "{field}" must be {CACHE_SALT_RULE}, got {got}'
    return field_error_text(field, CACHE_SALT_RULE, value)


class RequestStatus(enum.IntEnum):
    """Lifecycle of a request; every status above ``PREEMPTED`` is finished."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED


FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


class QuestionPrompt(NamedTuple):
    """One question of a question group: the text its labels are scored after, as tokens.

    Attributes:
        prompt_token_ids: The document's tokens, then the question's own (its suffix).
        labels: The labels scored after them (as a ``choice`` row's, in order).
    """

    prompt_token_ids: list[int]
    labels: tuple[str, ...]


def common_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """The length of the longest token prefix every prompt of ``prompts`` starts with (a
    question group's document: the questions' prompts share its tokens)."""
    first, n = prompts[0], min(map(len, prompts))
    for i in range(n):
        t = first[i]
        if any(p[i] != t for p in prompts):
            return i
    return n


class EngineRequest(NamedTuple):
    """One request for the engine, as the input processor makes it (vLLM's
    ``EngineCoreRequest``; :class:`mlxpa.inputs.InputProcessor`).

    Attributes:
        request_id: The caller's id, unique among the engine's unfinished requests; an
            unseeded request's randomness comes from it (with the engine seed and the sample
            index).
        prompt_token_ids: The prompt's token ids (BOS included when the tokenizer adds one);
            for a question group, the document's: the questions' longest common prefix.
        sampling_params: How to sample and when to stop (``n`` samples of the prompt); for
            a question group only ``max_tokens`` counts: the most tokens its questions hold
            after the document (the KV pool's sizing reads it).
        questions: A question group (:mod:`mlxpa.engine.question_scores`): each question's
            prompt and labels, scored as ``choice`` rows over one prefill of the document;
            None: a plain request.
        cache_salt: vLLM's ``cache_salt``: the request reuses prefix-cache blocks only of
            requests with the same salt (None: the unsalted ones); see :attr:`Request.cache_salt`.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    questions: tuple[QuestionPrompt, ...] | None = None
    cache_salt: str | None = None


class TokenLogprob(NamedTuple):
    """One generated token's log-probability under the model (log-softmax of the raw
    logits, before the grammar mask, ``min_tokens`` and sampling filters).

    Attributes:
        token_id: The generated token.
        logprob: Its log-probability (natural log).
        top: The ``top_logprobs`` most likely ``(token_id, logprob)`` pairs, most likely first.
        rank: The token's rank in the vocabulary (vLLM's: how many tokens are at least as
            likely, so 1 for the most likely); None when not computed.
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int | None = None


@dataclass(eq=False, slots=True)
class Request:
    """One prompt being generated.

    Attributes:
        request_id: The caller's id (:attr:`EngineRequest.request_id`); the ``n`` samples of
            a prompt and a choice row's scoring requests share it.
        prompt_token_ids: Prompt tokens (BOS included when the tokenizer adds one).
        sampling_params: How to sample and when to stop.
        arrival_time: ``time.perf_counter()`` seconds at admission to the engine.
        sample_index: Which of the ``n`` samples of its prompt this request is (0-based).
        max_tokens: Effective output cap: ``sampling_params.max_tokens`` clamped so that
            prompt + output fits the model's context and the pool (set by the scheduler).
        output_token_ids: Generated tokens so far (after a stop, trimmed tokens stay here).
        status: Lifecycle status.
        num_computed_tokens: Tokens whose K/V are written in the pool (prefix hits included).
        num_cached_tokens: Prompt tokens served from the prefix cache at first admission.
        block_tables: Per KV cache group, KV block ids in token order: block ``i`` holds
            tokens ``[i * block_size, (i + 1) * block_size)`` (``0``, the null block, where a
            sliding-window group no longer keeps them).
        num_preemptions: Times this request was preempted (its blocks freed, recomputed later).
        token_times: ``perf_counter`` seconds of every sampled token (TTFT and ITL).
        stop_reason: The matched stop string or token id, when stopped by one.
        num_scored_tokens: How many tokens at the end of the prompt are scored: the runner
            returns the log-probability of each given the tokens before it (teacher-forced,
            as vLLM's ``prompt_logprobs``). Their logits are always computed: a prefix-cache
            hit stops before them. 0: none.
        scored_top_logprobs: For each scored token (and at the targets' position), also this
            many most likely tokens there (vLLM's ``prompt_logprobs`` count; 0: the scored
            token's alone).
        logprobs: Per output token, its :class:`TokenLogprob` (rows that ask for logprobs).
        target_token_ids: Token ids whose log-probabilities the runner returns from the
            logits of the last prompt token (the position its first output token would be
            sampled at), with ``scored_top_logprobs`` alternatives.
        score_only: The request samples nothing: it computes its prompt, its scored tokens
            and its targets, and finishes after its last prompt token (finish reason
            ``stop``, no output tokens; vLLM's pooling requests end the same way).
        prompt_logprobs: Prompt position to the :class:`TokenLogprob` of the prompt token
            there, for a request with ``sampling_params.prompt_logprobs`` (filled by the
            engine from the scored positions; samples 1..n-1 share sample 0's).
        key: The request's own key, unique in the process (the samples of a prompt and a
            choice row's requests share ``request_id``): what the engine's, the KV cache
            manager's and the runner's side tables are keyed by (vLLM keys them by its
            per-request ``req_id``).
        spec_token_ids: Draft tokens proposed to follow its output (speculative decoding),
            verified in its next step as far as the scheduler takes them (vLLM's).
        cache_salt: The prefix cache's namespace (vLLM's ``cache_salt``; TensorRT-LLM mixes
            it into the root of its block tree): the request hits, and shares in-batch, only
            blocks computed by requests with the same salt; None: the unsalted namespace.
            Its samples, forks and scoring requests inherit it.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = 0.0
    sample_index: int = 0
    max_tokens: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1
    block_tables: list[list[int]] = field(default_factory=list)
    num_preemptions: int = 0
    token_times: list[float] = field(default_factory=list)
    stop_reason: object = None
    num_scored_tokens: int = 0
    scored_top_logprobs: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    target_token_ids: tuple[int, ...] = ()
    prompt_logprobs: dict[int, TokenLogprob] = field(default_factory=dict)
    score_only: bool = False
    key: int = field(default_factory=lambda: next(_KEYS))
    spec_token_ids: list[int] = field(default_factory=list)
    cache_salt: str | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)


class LabelScores(NamedTuple):
    """One question's label scores, as a ``choice`` row's output carries them.

    Attributes:
        logprobs: Each label's total log-probability after the question (``choice_logprobs``).
        probs: ``softmax`` of them over the labels (``choice_probs``).
        outside_prob: The mass of writing none of the labels (``choice_outside_prob``).
    """

    logprobs: dict[str, float]
    probs: dict[str, float]
    outside_prob: float


@dataclass(slots=True)
class SampleOutput:
    """What the engine returns for one finished sample of a request (the public API groups
    the ``n`` samples of a prompt into :class:`mlxpa.entrypoints.outputs.RequestOutput`).

    Attributes:
        request_id: The request's id (the caller's).
        sample_index: Which sample of the prompt (n > 1), 0-based.
        text: Detokenized completion (stop string excluded).
        token_ids: Generated token ids (tokens after a stop string's end trimmed).
        finish_reason: ``stop``, ``length`` or ``abort`` (None in a ``DELTA`` output before
            the last).
        num_prompt_tokens: Prompt length in tokens.
        num_cached_tokens: Prompt tokens served from the prefix cache.
        ttft_s: Seconds from arrival to the first token (None when no token was generated).
        itl_s: Seconds between consecutive output tokens.
        error: Why the request could not run (finish reason ``abort``), else None.
        logprobs: Per token of ``token_ids``, its :class:`TokenLogprob` (rows that ask).
        choice_logprobs: For a ``choice`` row, each label's total log-probability given
            the prompt (see :mod:`mlxpa.engine.choice_scores`).
        prompt_logprobs: For a request with ``prompt_logprobs`` (vLLM's), one entry per
            prompt token: None for the first (nothing precedes it), then the token's
            :class:`TokenLogprob` given the tokens before it (``rank`` set, ``top`` its
            ``prompt_logprobs`` most likely alternatives).
        choice_probs: For a ``choice`` row, the labels' probabilities normalised over the
            labels (``softmax`` of ``choice_logprobs``; they sum to 1): the distribution
            the row's label is drawn from at temperature 1.
        choice_outside_prob: For a ``choice`` row, the model's probability of writing none
            of the labels after the prompt (``1 - sum(exp(choice_logprobs))`` over the
            labels whose tokens do not extend another label's tokens).
        stop_reason: The stop string or stop token id that ended the sample; None when EOS,
            the length cap or an error did (vLLM's ``CompletionOutput.stop_reason``).
        finished: The sample is done. A request with ``output_kind`` ``DELTA`` gets an output
            after every step that gave it something: ``text``, ``token_ids`` and ``logprobs``
            hold only what is new (text that could still become a stop string is held back),
            and the last one (``finished``) carries the rest and every other field, so the
            pieces joined equal the ``FINAL_ONLY`` output.
        question_scores: For a question group, each question's :class:`LabelScores`, in the
            order of :attr:`EngineRequest.questions`; else None.
    """

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str | None
    num_prompt_tokens: int
    sample_index: int = 0
    num_cached_tokens: int = 0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None
    choice_logprobs: dict[str, float] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    choice_probs: dict[str, float] | None = None
    choice_outside_prob: float | None = None
    stop_reason: int | str | None = None
    finished: bool = True
    question_scores: list[LabelScores] | None = None


def sample_output(req: Request, text: str, eos_token_ids: frozenset[int],
                  sample_index: int | None = None) -> SampleOutput:
    """The :class:`SampleOutput` of a finished request.

    Args:
        req: The request (finished; a sample's request, or a choice row's sample).
        text: Its detokenized completion.
        eos_token_ids: The model's EOS ids (EOS is no ``stop_reason``, as in vLLM, even when
            it is also a stop token id, unless the request ignores EOS).
        sample_index: The sample it reports (None: ``req.sample_index``).
    """
    times = req.token_times
    tokens = list(req.output_token_ids)
    reason = req.stop_reason if req.status == RequestStatus.FINISHED_STOPPED else None
    if reason in eos_token_ids and not req.sampling_params.ignore_eos:
        reason = None
    return SampleOutput(
        request_id=req.request_id,
        sample_index=req.sample_index if sample_index is None else sample_index,
        text=text, token_ids=tokens,
        finish_reason=req.finish_reason or "abort", num_prompt_tokens=req.num_prompt_tokens,
        num_cached_tokens=max(req.num_cached_tokens, 0),
        ttft_s=times[0] - req.arrival_time if times else None,
        itl_s=[b - a for a, b in zip(times, times[1:])],
        error=req.stop_reason if req.finish_reason == "abort" and isinstance(
            req.stop_reason, str) else None,
        logprobs=(req.logprobs[:len(tokens)] if req.sampling_params.logprobs is not None
                  else None), stop_reason=reason, prompt_logprobs=_prompt_logprobs(req))


def _prompt_logprobs(req: Request) -> list[TokenLogprob | None] | None:
    """vLLM's ``prompt_logprobs`` of a request that asks: None for the first prompt token,
    then each token's :class:`TokenLogprob` (None where it was not computed: a request that
    failed before its prefill ended)."""
    if req.sampling_params.prompt_logprobs is None:
        return None
    return [None] + [req.prompt_logprobs.get(p) for p in range(1, req.num_prompt_tokens)]
