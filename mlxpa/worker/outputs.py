"""What the model runner returns for one step (vLLM v1's ``ModelRunnerOutput``), and the empty
result of a step that computes nothing (vLLM's ``EMPTY_MODEL_RUNNER_OUTPUT``)."""

from __future__ import annotations

from typing import NamedTuple

from mlxpa.request import TokenLogprob


class StepResult(NamedTuple):
    """What one step produced; read by the engine, never mutated.

    Every table is keyed by the request's ``key`` (vLLM's ``req_id``).

    Attributes:
        sampled: Per request whose chunk reached its last token and that samples
            (``SchedulerOutput.sampling``), in ``SchedulerOutput.requests`` order, its emitted
            tokens: one, or after draft tokens the accepted drafts and the next token.
        logprobs: Per request that asks (``logprobs``), each emitted token's
            :class:`TokenLogprob`.
        scored: Per request with scored tokens in this step's chunk
            (``num_scored_tokens``), position to the :class:`TokenLogprob` of the prompt
            token there, given the tokens before it (``scored_top_logprobs`` alternatives).
        targets: Per request with ``target_token_ids`` whose chunk ended its prompt, the
            :class:`TokenLogprob` of each target id at its last prompt token (its
            ``scored_top_logprobs`` alternatives in ``top``).
        grammar_ended: The constrained requests whose grammar ended with their sampled
            token: None when it is complete (only EOS may follow), else the matcher's error.
        mask_time_s: Seconds spent filling the grammar bitmask; None when no request of the
            step was constrained.
        spec_token_ids: Per request that sampled, the draft tokens proposed to follow what
            it emitted (speculative decoding; absent without drafts).
    """

    sampled: list[list[int]]
    logprobs: dict[int, list[TokenLogprob]]
    scored: dict[int, dict[int, TokenLogprob]]
    targets: dict[int, list[TokenLogprob]]
    grammar_ended: dict[int, str | None]
    mask_time_s: float | None
    spec_token_ids: dict[int, list[int]] = {}


# The result of a step that schedules no token (it only frees finished requests' state).
EMPTY_STEP_RESULT = StepResult([], {}, {}, {}, {}, None)
