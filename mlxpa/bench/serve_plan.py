"""The plan of one ``mlxpa bench serve`` sitting: its load levels, on which endpoints, with which
requests, and the warm-up requests.

Every endpoint measured gets every load level; each (endpoint, level) pair draws its own
prompts (pair ``j`` from ``seed + j``), so no level finds the prompts of one before it in a
server's prefix cache, and every system gets the same prompts at the same pair. A file's rows
pick their own endpoints and are the same at every level. The warm-up requests are other
prompts (``seed + 10,000``), a few tokens each, on every endpoint measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from mlxpa.bench.serve_load import LoadSpec
from mlxpa.bench.serve_systems import Level
from mlxpa.bench.serve_workloads import ServeRequest, ServeWorkload

WARMUP_REQUESTS, WARMUP_TOKENS, WARMUP_SEED = 2, 4, 10_000
BOTH = "both"


def endpoints_of(workload: str, endpoint: str | None) -> tuple[str | None, ...]:
    """The endpoints a workload is measured on: ``--endpoint``'s (``both``: chat, then
    completions); by default both for ``shared-prefix`` (mlx_lm.server reuses a chat system
    message but no completions prefix on Gemma 3: one endpoint hides half of it), chat for
    ``random``, completions for the text workloads (few-shot prompts for a base model);
    ``(None,)`` for ``file`` (its rows pick theirs).

    Raises:
        ValueError: ``--endpoint`` with ``--workload file``.
    """
    if workload == "file":
        if endpoint is not None:
            raise ValueError("--endpoint does not apply to --workload file (its rows pick "
                             "theirs)")
        return (None,)
    if endpoint is None:
        endpoint = {"shared-prefix": BOTH, "random": "chat"}.get(workload, "completions")
    return ("chat", "completions") if endpoint == BOTH else (endpoint,)


def load_specs(concurrency: str | None, request_rate: str | None, seed: int,
               max_duration: float, request_timeout: float) -> list[LoadSpec]:
    """The load levels of ``--concurrency`` and ``--request-rate`` (comma-separated).

    Raises:
        ValueError: A value that is not a positive number, or several concurrencies with
            request rates.
    """
    caps = _numbers(concurrency or ("" if request_rate else "1,8,16,32"), int, "--concurrency")
    rates = _numbers(request_rate or "", float, "--request-rate")
    if rates and len(caps) > 1:
        raise ValueError("with --request-rate, --concurrency is one cap, not a list")
    kw = dict(seed=seed, max_duration_s=max_duration, request_timeout_s=request_timeout)
    if rates:
        return [LoadSpec(caps[0] if caps else None, rate, **kw) for rate in rates]
    return [LoadSpec(c, None, **kw) for c in caps]


def _numbers(text: str, kind: type, flag: str) -> list:
    values = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            value = kind(part)
        except ValueError:
            value = None
        if value is None or not value > 0:
            raise ValueError(f"{flag} takes positive numbers, comma-separated; got {part!r}")
        values.append(value)
    return values


def plan_levels(make: Callable[[str | None, int], ServeWorkload], specs: list[LoadSpec],
                endpoints: tuple[str | None, ...], seed: int,
                ) -> tuple[list[Level], list[ServeRequest], dict]:
    """The levels, warm-up requests and the workload's description of a sitting.

    Args:
        make: ``make(endpoint, seed)`` -> the workload's requests to that endpoint.
        specs: The load levels.
        endpoints: The endpoints measured (:func:`endpoints_of`).
        seed: The sitting's seed.

    Returns:
        ``(levels, warmup, info)``: every endpoint's levels in turn; the warm-up requests
        (:data:`WARMUP_REQUESTS` per endpoint, at most :data:`WARMUP_TOKENS` tokens each);
        the first workload's name and parameters (``not_round_trip``: over every level) with
        ``endpoints``, ``num_requests``, ``prompt_tokens`` and ``max_output_tokens`` per
        level.
    """
    made = [(spec, endpoint, make(endpoint, seed + j * len(specs) + k))
            for j, endpoint in enumerate(endpoints) for k, spec in enumerate(specs)]
    levels = [Level(spec, wl.requests, endpoint) for spec, endpoint, wl in made]
    warmup = [dataclasses.replace(r, row={**r.row, "max_tokens": min(WARMUP_TOKENS,
                                                                     r.max_tokens)})
              for endpoint in endpoints
              for r in make(endpoint, seed + WARMUP_SEED).requests[:WARMUP_REQUESTS]]
    first = made[0][2]
    params = {k: v for k, v in first.params.items() if k != "endpoint"}
    if "not_round_trip" in params:
        params["not_round_trip"] = sum(wl.params["not_round_trip"] for *_, wl in made)
    info = {"name": first.name, **params, "endpoints": [e for e in endpoints if e],
            "num_requests": len(first.requests), "prompt_tokens": first.num_prompt_tokens,
            "max_output_tokens": first.num_output_tokens}
    return levels, warmup, info
