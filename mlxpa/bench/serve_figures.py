"""The figures of one load on one server: throughput, latency percentiles and failures.

Throughput counts the successful requests over the load's duration (the first request sent
to the last one ended), as vLLM's serving benchmark does: requests/s, output tokens/s, and
total (prompt + output) tokens/s. A request's output tokens are the server's
``usage.completion_tokens`` when it sends one, else its streamed text tokenized again; its
prompt tokens are ``usage.prompt_tokens`` (what that server counted), else the workload's
count; the workload's count of the same requests stands beside it, so a server that read the
prompts as other tokens shows. Latencies
(seconds) are over successful requests: TTFT and end-to-end latency one per request, ITL one
per gap between streamed events carrying text, TPOT (time per output token after the first)
one per request with more than one token. Percentiles are
:func:`mlxpa.engine.metrics.percentile`'s.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable

from mlxpa.bench.serve_load import LoadResult
from mlxpa.bench.serve_workloads import ServeRequest
from mlxpa.engine.metrics import percentile

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "itl", "e2e", "tpot")


def token_counter(tokenizer) -> Callable[[str], int]:
    """``count(text)``: the tokens of ``text`` (no special tokens added)."""
    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False)) if text else 0
    return count


def output_tokens(result, count_tokens: Callable[[str], int]) -> tuple[int, bool]:
    """``(tokens, from_usage)``: the server's completion tokens, else the text's tokens."""
    if isinstance(result.completion_tokens, int):
        return result.completion_tokens, True
    return count_tokens(result.text), False


def latency_figures(name: str, values: list[float]) -> dict:
    """``<name>_mean_s`` and ``<name>_p50_s`` ... of ``values`` (None for no values)."""
    out = {f"{name}_mean_s": statistics.fmean(values) if values else None}
    out.update({f"{name}_p{q}_s": percentile(values, q) for q in PERCENTILES})
    return out


def load_figures(load: LoadResult, requests: list[ServeRequest],
                 count_tokens: Callable[[str], int]) -> dict:
    """The figures of ``load`` (see the module).

    Args:
        load: What the load generator measured.
        requests: The workload sent (prompt lengths by index).
        count_tokens: Tokens of a text, for servers that send no usage.

    Returns:
        A JSON-able dict: ``completed``, ``failed``, ``not_sent``, ``failures`` (count by
        kind), ``first_error``, ``duration_s``, ``prompt_tokens`` (the server's count),
        ``prompt_tokens_counted`` (``usage``, ``workload`` or ``usage+workload``),
        ``workload_prompt_tokens`` (the bench's count of the same requests),
        ``prompt_tokens_per_request``, ``output_tokens``,
        ``output_tokens_counted`` (``usage``, ``tokenizer`` or ``usage+tokenizer``),
        ``requests_per_s``, ``output_tokens_per_s``, ``total_tokens_per_s``, and for TTFT,
        ITL, E2E and TPOT the mean, p50, p90 and p99 in seconds.
    """
    by_index = {r.index: r for r in requests}
    ok = [r for r in load.results if r.success]
    failed = [r for r in load.results if not r.success]
    prompt = out = ours = 0
    tpot: list[float] = []
    sources, prompt_sources = set(), set()
    for r in ok:
        n, from_usage = output_tokens(r, count_tokens)
        sources.add("usage" if from_usage else "tokenizer")
        out += n
        ours += by_index[r.index].prompt_len
        counted = isinstance(r.prompt_tokens, int)
        prompt_sources.add("usage" if counted else "workload")
        prompt += r.prompt_tokens if counted else by_index[r.index].prompt_len
        if n > 1 and r.ttft_s is not None:
            tpot.append((r.e2e_s - r.ttft_s) / (n - 1))
    d = max(load.duration_s, 1e-9)
    figures = {
        "completed": len(ok), "failed": len(failed), "not_sent": load.not_sent,
        "failures": dict(Counter(r.failure for r in failed)),
        "first_error": failed[0].error if failed else None,
        "duration_s": load.duration_s, "prompt_tokens": prompt,
        "prompt_tokens_counted": "+".join(sorted(prompt_sources, reverse=True)) or None,
        "workload_prompt_tokens": ours,
        "prompt_tokens_per_request": prompt / len(ok) if ok else None, "output_tokens": out,
        "output_tokens_counted": "+".join(sorted(sources, reverse=True)) or None,
        "requests_per_s": len(ok) / d, "output_tokens_per_s": out / d,
        "total_tokens_per_s": (prompt + out) / d,
    }
    figures.update(latency_figures("ttft", [r.ttft_s for r in ok if r.ttft_s is not None]))
    figures.update(latency_figures("itl", [x for r in ok for x in r.itl_s]))
    figures.update(latency_figures("e2e", [r.e2e_s for r in ok]))
    figures.update(latency_figures("tpot", tpot))
    return figures
