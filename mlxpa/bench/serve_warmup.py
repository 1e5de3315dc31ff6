"""Warm-up of a server before its timed loads: it ends with a generated token, not a health check.

A server's health route says little about its model: ``mlx_lm.server`` answers ``/health``
and ``/v1/models`` before it has loaded anything (it loads on the first request), and
llama.cpp's server answers 503 while it loads. So the warm-up first sends one request alone,
again while the server answers 503 (once a second, bounded in count and time), until it comes
back with at least one generated token (the model loaded, its first graph built); any other
answer without a token ends the warm-up, and the system is not measured. Then every warm-up
request goes at once, and each must generate a token. Only then does timing start.
"""

from __future__ import annotations

import time

from mlxpa.bench.serve_figures import output_tokens
from mlxpa.bench.serve_load import LoadSpec, drive
from mlxpa.bench.serve_workloads import ServeRequest

MAX_ATTEMPTS = 600
RETRY_PAUSE_S = 1.0
LOADING = 503  # what a server answers while it loads its model (llama.cpp's), tried again


class WarmupError(RuntimeError):
    """The server did not generate a token in its warm-up; the message says what it answered."""


def _generated(result) -> int:
    """Tokens a warm-up request generated (0 for a failed one): the usage count, else 1 for
    streamed text."""
    if not result.success:
        return 0
    return output_tokens(result, lambda text: 1 if text else 0)[0]


def warm_up(base_url: str, requests: list[ServeRequest], model: str, ignore_eos: bool,
            timeout_s: float = 600.0) -> dict:
    """Warm the server at ``base_url`` up with ``requests`` (see the module).

    Args:
        base_url: ``http://host:port`` of the server.
        requests: The warm-up requests (few tokens each); the first is sent alone first.
        model: The ``model`` field.
        ignore_eos: Send ``ignore_eos: true``.
        timeout_s: Most seconds the whole warm-up may take.

    Returns:
        ``{"requests", "attempts", "generated_tokens", "seconds"}``: requests completed, tries
        of the first one, tokens generated over all of them, seconds the warm-up took.

    Raises:
        WarmupError: The first request came back without a token (other than 503), no
            token came back within ``timeout_s`` (or :data:`MAX_ATTEMPTS` tries), or a request
            of the batch generated none.
    """
    started = time.perf_counter()
    deadline = started + timeout_s
    spec = LoadSpec(concurrency=1, request_timeout_s=timeout_s, max_duration_s=timeout_s)
    last = "nothing sent"
    for attempt in range(1, MAX_ATTEMPTS + 1):
        result = drive(base_url, requests[:1], spec, model, ignore_eos).results[0]
        tokens = _generated(result)
        if tokens > 0:
            break
        last = result.error or "a stream without a generated token"
        if result.status != LOADING or time.perf_counter() + RETRY_PAUSE_S > deadline:
            raise WarmupError(f"no generated token in the warm-up ({attempt} "
                              f"{'try' if attempt == 1 else 'tries'} in "
                              f"{time.perf_counter() - started:.1f} s; last: {last})")
        time.sleep(RETRY_PAUSE_S)
    else:
        raise WarmupError(f"no generated token in {MAX_ATTEMPTS} warm-up tries (last: {last})")
    rest = max(1.0, deadline - time.perf_counter())
    batch = drive(base_url, requests, LoadSpec(concurrency=len(requests), request_timeout_s=rest,
                                               max_duration_s=rest), model, ignore_eos)
    counts = [_generated(r) for r in batch.results]
    if len(counts) < len(requests) or 0 in counts:
        bad = next((r for r in batch.results if _generated(r) == 0), None)
        why = (bad.error or "no generated token") if bad is not None else "not sent"
        raise WarmupError(f"a warm-up request generated nothing: {why}")
    return {"requests": 1 + len(requests), "attempts": attempt,
            "generated_tokens": tokens + sum(counts),
            "seconds": time.perf_counter() - started}
