"""Per-step outputs of requests that stream (vLLM's ``RequestOutputKind.DELTA``): after each
step, a running sample's new token ids, its new text (what no later token can change:
:meth:`~mlxpa.engine.detokenizer.IncrementalDetokenizer.take_text`) and their
log-probabilities; when it finishes, the rest, with the finish reason, usage, latencies and
label probabilities. The pieces joined equal the sample's ``FINAL_ONLY`` output exactly: the
same detokenizer, stop strings and ``finalize`` make both.
"""

from __future__ import annotations

from mlxpa.engine.detokenizer import IncrementalDetokenizer
from mlxpa.request import Request, SampleOutput
from mlxpa.sampling_params import RequestOutputKind


def step_delta(req: Request, detok: IncrementalDetokenizer) -> SampleOutput:
    """The output of running sample ``req`` after a step: the tokens (and their
    log-probabilities, when asked) since its last output, the text ``detok`` can release
    (possibly ``""``); ``finished`` False, ``finish_reason`` None."""
    start, end = detok.num_tokens_taken, req.num_output_tokens
    detok.num_tokens_taken = end
    logprobs = (req.logprobs[start:end] if req.sampling_params.logprobs is not None
                else None)
    return SampleOutput(request_id=req.request_id, text=detok.take_text(),
                        token_ids=req.output_token_ids[start:end], finish_reason=None,
                        num_prompt_tokens=req.num_prompt_tokens,
                        sample_index=req.sample_index,
                        num_cached_tokens=max(req.num_cached_tokens, 0), logprobs=logprobs,
                        finished=False)


def final_delta(out: SampleOutput, detok: IncrementalDetokenizer) -> SampleOutput:
    """``out``, a finished sample's whole output, as its last ``DELTA`` output (in place):
    the text, tokens and log-probabilities its earlier outputs did not hold. ``out``
    unchanged for a ``FINAL_ONLY`` request (nothing was taken)."""
    start = detok.num_tokens_taken
    out.text = detok.rest(out.text)
    out.token_ids = out.token_ids[start:]
    if out.logprobs is not None:
        out.logprobs = out.logprobs[start:]
    return out


def wants_deltas(req: Request) -> bool:
    """Whether ``req``'s request asks for an output after every step."""
    return req.sampling_params.output_kind == RequestOutputKind.DELTA
