"""``mlxpa-offline`` in ``mlxpa bench serve``: the same requests through mlxpa's offline Python
API (:class:`~mlxpa.entrypoints.llm.LLM`), every request given at once, in this process.

It measures what the engine does without a server in front: throughput only. Its requests
do not arrive over time or wait for a client, so TTFT, ITL and end-to-end latency under a
concurrency mean nothing here and are not reported (None).
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable

from mlxpa.bench.serve_figures import latency_figures
from mlxpa.bench.serve_workloads import ServeRequest
from mlxpa.bench.server_process import PeakRSS

OFFLINE = "mlxpa-offline"
LOAD_LABEL = "offline"


def _ignore(n: int) -> None:
    pass


def offline_rows(requests: list[ServeRequest], ignore_eos: bool) -> list[dict]:
    """The requests as rows of ``mlxpa run`` (``ignore_eos`` where a row does not set it)."""
    return [{**r.row, **({} if "ignore_eos" in r.row else {"ignore_eos": ignore_eos})}
            for r in requests]


def run_offline(model: str | None, requests: list[ServeRequest], warmup: list[ServeRequest],
                ignore_eos: bool, advance: Callable[[int], None] = _ignore,
                **engine_args) -> dict:
    """Load ``model`` with :class:`~mlxpa.entrypoints.llm.LLM` (its KV pool the whole budget
    from the start unless ``engine_args`` set ``kv_segment_bytes``), run ``warmup``, then time
    ``requests`` through :meth:`~mlxpa.entrypoints.llm.LLM.generate_iter` (the rows in prefix
    order, as ``mlxpa run``; ``advance`` told each finished request's output tokens).

    Returns:
        Figures with the keys of :func:`~mlxpa.bench.serve_figures.load_figures` (latencies
        None) and ``peak_rss_bytes``, this process's peak resident memory during the timed run.

    Raises:
        FileNotFoundError, ValueError: The model cannot be loaded.
    """
    from mlxpa.entrypoints.llm import LLM

    # the KV pool takes the whole budget at load (kv_segment_bytes 0, unless given): it does
    # not grow inside the timed run
    llm = LLM(model, **{"kv_segment_bytes": 0, **engine_args})
    try:
        for _ in llm.generate_iter(offline_rows(warmup, ignore_eos)):
            pass
        ok, failed, errors, prompt, out = 0, 0, [], 0, 0
        with PeakRSS(os.getpid()) as rss:
            t0 = time.perf_counter()
            for o in llm.generate_iter(offline_rows(requests, ignore_eos), ordered=False):
                if o.error is not None:
                    failed += 1
                    errors.append(o.error)
                    continue
                n = sum(len(c.token_ids) for c in o.outputs)
                ok, prompt, out = ok + 1, prompt + len(o.prompt_token_ids), out + n
                advance(n)
            elapsed = max(time.perf_counter() - t0, 1e-9)
    finally:
        del llm
        gc.collect()
    figures = {"completed": ok, "failed": failed, "not_sent": 0,
               "failures": {"engine": failed} if failed else {},
               "first_error": errors[0] if errors else None, "duration_s": elapsed,
               "prompt_tokens": prompt, "prompt_tokens_counted": "engine",
               "workload_prompt_tokens": (sum(r.prompt_len for r in requests) if not failed
                                          else None),
               "prompt_tokens_per_request": prompt / ok if ok else None,
               "output_tokens": out, "output_tokens_counted": "engine",
               "requests_per_s": ok / elapsed, "output_tokens_per_s": out / elapsed,
               "total_tokens_per_s": (prompt + out) / elapsed}
    for name in ("ttft", "itl", "e2e", "tpot"):
        figures.update(latency_figures(name, []))
    return {**figures, "peak_rss_bytes": rss.peak_bytes}
