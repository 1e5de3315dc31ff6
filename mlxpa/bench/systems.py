"""``mlxpa bench``: our engine against mlx-lm and static allocation, same prompts, one run.

Systems (each warmed up, then timed; the order rotates between repeats so none always runs
first; figures are medians over repeats):

- ``mlxpa``: this engine (paged KV cache, continuous batching, prefix caching);
- ``mlxpa-noprefix``: the same with prefix caching off;
- ``mlxpa-nocascade``: the same with cascade attention off (``--disable-cascade-attn``: each
  decode row reads a shared prefix itself);
- ``mlxpa-nospec``: the same with speculative decoding off (the A/B of
  ``--speculative-config``);
- ``mlx-lm``: ``mlx_lm.batch_generate``'s loop (a ``BatchGenerator``, its default batch sizes)
  on the same token ids and model object;
- ``static``: one contiguous KV cache per request, requests one after another with
  ``mlx_lm.stream_generate`` (static allocation).

Every system generates exactly ``output_len`` tokens per request (EOS ignored) or, for a
workload whose rows end by themselves (:attr:`~mlxpa.bench.workloads.Workload.exact_lengths`
False), at most that many: a row ends at an EOS token unless the workload ignores EOS, and at
the token whose text completes one of its stop strings. Every system finds stop strings with
the engine's own :class:`~mlxpa.engine.detokenizer.IncrementalDetokenizer` (mlx-lm's
``BatchGenerator`` matches them as token ids, which misses a stop string the model writes with
other tokens than its encoding; so the bench matches the text and removes the row, as mlxpa
ends it). Every token generated counts, an EOS or the stopping token included, as the engine
counts them; each is reported to an ``advance(n)`` callback as it comes (the progress bar of
``mlxpa bench``).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx

from mlxpa.bench.progress import BenchProgress
from mlxpa.bench.workloads import Workload
from mlxpa.config import EngineConfig
from mlxpa.data.reader_options import plural
from mlxpa.engine.metrics import percentile
from mlxpa.sampling_params import SamplingParams

Advance = Callable[[int], None]  # told each batch of output tokens as it is generated


def _ignore(n: int) -> None:
    pass


@dataclass
class SystemResult:
    """One timed run of one system (seconds, tokens, bytes)."""

    elapsed_s: float
    prompt_tokens: int
    generation_tokens: int
    num_requests: int
    peak_memory_bytes: int
    kv_bytes: int | None = None
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    kv_blocks_over_time: list[tuple[float, int]] = field(default_factory=list)

    def figures(self) -> dict:
        """Derived figures: rates per second, latency percentiles (as ``--metrics-json``),
        memory."""
        pct = percentile
        e = self.elapsed_s
        return {
            "requests_per_s": self.num_requests / e,
            "total_tokens_per_s": (self.prompt_tokens + self.generation_tokens) / e,
            "output_tokens_per_s": self.generation_tokens / e,
            "elapsed_s": e, "generation_tokens": self.generation_tokens,
            "ttft_p50_s": pct(self.ttft_s, 50), "ttft_p99_s": pct(self.ttft_s, 99),
            "itl_p50_s": pct(self.itl_s, 50), "itl_p99_s": pct(self.itl_s, 99),
            "peak_memory_bytes": self.peak_memory_bytes, "kv_bytes": self.kv_bytes,
            **self.extra,
        }


def _no_eos(tokenizer, ignore: bool = True):
    """Context: the tokenizer reports no EOS ids (mlx-lm's generators then never stop early);
    with ``ignore`` False, nothing changes."""
    class _Ctx:
        def __enter__(self):
            self.saved = set(tokenizer.eos_token_ids)
            if ignore:
                tokenizer.eos_token_ids = set()

        def __exit__(self, *exc):
            tokenizer.eos_token_ids = self.saved
    return _Ctx()


def _stop_checks(tokenizer, wl: Workload) -> list[Callable[[int], bool] | None]:
    """Per row, ``check(token) -> True`` once the row's text completes one of its stop
    strings (the engine's detokenizer and rule), or None for a row without any."""
    from mlxpa.engine.detokenizer import IncrementalDetokenizer

    return [IncrementalDetokenizer(tokenizer, stop).add_token if stop else None
            for stop in wl.stop or [()] * len(wl.prompts)]


def run_mlxpa(model, tokenizer, wl: Workload, config: EngineConfig,
              advance: Advance = _ignore) -> SystemResult:
    """Our engine on the workload, admitted in prefix order as ``mlxpa run`` does (when
    prefix caching is on), its KV pool sized to the workload as ``run`` sizes it
    (:meth:`~mlxpa.engine.LLMEngine.kv_blocks_needed`); records KV blocks in use after every step,
    and the decode phase apart: the steps in which every scheduled request computes one
    token (``decode_output_tokens_per_s``: their output tokens over their seconds)."""
    from mlxpa.core.prefix_order import prefix_order
    from mlxpa.engine import LLMEngine
    from mlxpa.engine.metrics import summarize

    max_tokens = [n if wl.questions is None else _after(wl.prompts[i], wl.questions[i])
                  for i, n in enumerate(wl.output_lens)]
    lengths = ((len(p), n, 1) for p, n in zip(wl.prompts, max_tokens))
    engine = LLMEngine(config, model, tokenizer, expected_requests=lengths)
    t0 = time.perf_counter()
    engine.counters.start_time = t0
    order = (prefix_order(wl.prompts, config.block_size) if config.enable_prefix_caching
             else range(len(wl.prompts)))
    for i in order:
        engine.add_request(str(i), wl.prompts[i], SamplingParams(
            max_tokens=max_tokens[i], ignore_eos=wl.ignore_eos,
            stop=wl.stop[i] if wl.stop else (), structured_outputs=wl.structured),
            None if wl.questions is None else wl.questions[i])
    series, shown = [], 0
    decode_only = _watch_decode_steps(engine)
    decode_s, decode_tokens, decode_steps = 0.0, 0, 0
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        now = time.perf_counter()
        series.append((now - t0, engine.kv_cache_manager.num_active_blocks))
        new = engine.counters.generation_tokens - shown
        if decode_only[-1]:
            decode_s, decode_tokens, decode_steps = (decode_s + now - start,
                                                     decode_tokens + new, decode_steps + 1)
        advance(new)
        shown = engine.counters.generation_tokens
    elapsed = time.perf_counter() - t0
    c, s = engine.counters, summarize(engine.counters)
    return SystemResult(
        elapsed, c.prompt_tokens, c.generation_tokens, c.requests, mx.get_peak_memory(),
        kv_bytes=c.peak_kv_bytes, ttft_s=list(c.ttft_s),
        itl_s=list(c.itl_s), kv_blocks_over_time=series,
        extra={"prefix_cache_hit_rate": s.prefix_cache_hit_rate,
               "cached_prompt_tokens": c.cached_prompt_tokens,
               "kv_utilization": s.kv_utilization, "peak_kv_blocks": c.peak_kv_blocks,
               "num_preemptions": c.num_preemptions, "mask_ms_per_step": s.mask_ms_per_step,
               "scored_tokens": c.scored_tokens, "kv_cache_dtype": config.kv_cache_dtype,
               "kv_bytes_per_token": engine.runner.kv_storage.token_bytes,
               "peak_kv_bytes_by_group": dict(c.peak_kv_bytes_by_group),
               "peak_running_requests": c.peak_running,
               "speculative_config": (None if config.speculative_config is None else
                                      dataclasses.asdict(config.speculative_config)),
               "spec_decoding": s.spec_decoding,
               "decode_steps": decode_steps, "decode_s": decode_s,
               "decode_output_tokens_per_s": decode_tokens / decode_s if decode_s else None})


def _after(document: list[int], questions) -> int:
    """A question group's ``max_tokens``: the most tokens a question and its longest label
    hold after the document (what the pool is sized for)."""
    return max(len(q.prompt_token_ids) - len(document) + max(len(x) for x in q.labels) + 8
               for q in questions)


def _no_questions(name: str, wl: Workload) -> None:
    if wl.questions is not None:
        raise ValueError(f"{name} cannot ask typed questions (--questions); run "
                         "--baselines mlxpa")


def _watch_decode_steps(engine) -> list[bool]:
    """A list the engine's runner appends to, for each step it executes, whether every
    scheduled request computes one token (a decode-phase step; a step that computes nothing
    is not one)."""
    seen = [False]
    execute = engine.runner.execute

    def watched(out):
        seen.append(bool(out.requests) and all(n == 1 for n in out.num_scheduled_tokens))
        return execute(out)

    engine.runner.execute = watched
    return seen


def run_mlx_lm(model, tokenizer, wl: Workload, advance: Advance = _ignore) -> SystemResult:
    """mlx-lm's batched generation: ``mlx_lm.batch_generate``'s own loop (mlx-lm 0.32: a
    ``BatchGenerator`` with its default batch sizes, texts decoded at the end), written out
    so that tokens can be counted as they come, and a row that reaches a stop string removed
    (``BatchGenerator.remove``)."""
    from mlx_lm.generate import BatchGenerator

    _no_questions("mlx-lm", wl)
    checks = _stop_checks(tokenizer, wl)
    with _no_eos(tokenizer, wl.ignore_eos):
        t0 = time.perf_counter()
        gen = BatchGenerator(model, stop_tokens=[[t] for t in tokenizer.eos_token_ids])
        uids = gen.insert(wl.prompts, wl.output_lens)
        check = dict(zip(uids, checks))
        tokens: dict[int, list[int]] = {uid: [] for uid in uids}
        while responses := gen.next_generated():
            stopped = []
            for r in responses:
                tokens[r.uid].append(r.token)  # an EOS too: generated, as mlxpa counts it
                if r.finish_reason is None and check[r.uid] and check[r.uid](r.token):
                    stopped.append(r.uid)
            if stopped:
                gen.remove(stopped)
            advance(len(responses))
        gen.close()
        _texts = [tokenizer.decode(t) for t in tokens.values()]  # as batch_generate does
        elapsed = time.perf_counter() - t0
    generated = sum(map(len, tokens.values()))
    return SystemResult(elapsed, wl.num_prompt_tokens, generated, len(wl.prompts),
                        mx.get_peak_memory())


def run_static(model, tokenizer, wl: Workload, advance: Advance = _ignore) -> SystemResult:
    """One request at a time, each with its own contiguous KV cache (static allocation)."""
    from mlx_lm import stream_generate
    from mlx_lm.models.cache import make_prompt_cache

    _no_questions("static", wl)
    ttft, itl, generated, kv = [], [], 0, 0
    checks = _stop_checks(tokenizer, wl)
    with _no_eos(tokenizer, wl.ignore_eos):
        t0 = time.perf_counter()
        for ids, n, check in zip(wl.prompts, wl.output_lens, checks):
            cache = make_prompt_cache(model)
            start = last = time.perf_counter()
            for k, r in enumerate(stream_generate(model, tokenizer, mx.array(ids), max_tokens=n,
                                                  prompt_cache=cache)):
                now = time.perf_counter()
                (ttft.append(now - start) if k == 0 else itl.append(now - last))
                last = now
                generated += 1
                advance(1)
                if r.finish_reason is None and check is not None and check(r.token):
                    break
            kv = max(kv, sum(c.nbytes for c in cache))
        elapsed = time.perf_counter() - t0
    return SystemResult(elapsed, wl.num_prompt_tokens, generated, len(wl.prompts),
                        mx.get_peak_memory(), kv_bytes=kv, ttft_s=ttft, itl_s=itl)


def run_system(name: str, model, tokenizer, wl: Workload, config: EngineConfig,
               advance: Advance = _ignore) -> SystemResult:
    """Run one system on ``wl`` with the peak-memory counter reset first (``advance``: told
    the output tokens as they are generated).

    Raises:
        ValueError: Unknown system name.
    """
    if name not in SYSTEMS:
        raise ValueError(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}")
    mx.synchronize()
    mx.clear_cache()
    mx.reset_peak_memory()
    return SYSTEMS[name](model, tokenizer, wl, config, advance)


def _run_mlxpa_noprefix(model, tokenizer, wl: Workload, config: EngineConfig,
                        advance: Advance) -> SystemResult:
    return run_mlxpa(model, tokenizer, wl, dataclasses.replace(config, enable_prefix_caching=False),
                     advance)


def _run_mlxpa_nocascade(model, tokenizer, wl: Workload, config: EngineConfig,
                         advance: Advance) -> SystemResult:
    return run_mlxpa(model, tokenizer, wl,
                     dataclasses.replace(config, disable_cascade_attn=True), advance)


def _run_mlxpa_nospec(model, tokenizer, wl: Workload, config: EngineConfig,
                      advance: Advance) -> SystemResult:
    return run_mlxpa(model, tokenizer, wl, dataclasses.replace(config, speculative_config=None),
                     advance)


# Every system by name, in report order: ``(model, tokenizer, workload, config, advance)`` to
# a result.
SYSTEMS: dict[str, Callable[..., SystemResult]] = {
    "mlxpa": run_mlxpa,
    "mlxpa-noprefix": _run_mlxpa_noprefix,
    "mlxpa-nocascade": _run_mlxpa_nocascade,
    "mlxpa-nospec": _run_mlxpa_nospec,
    "mlx-lm": lambda model, tokenizer, wl, config, advance: run_mlx_lm(model, tokenizer, wl,
                                                                        advance),
    "static": lambda model, tokenizer, wl, config, advance: run_static(model, tokenizer, wl,
                                                                        advance),
}


# The figures each timed run keeps in ``figures[system]["runs"]`` when a bench repeats.
RUN_KEYS = ("total_tokens_per_s", "decode_output_tokens_per_s", "elapsed_s", "decode_s")


def run_bench(model, tokenizer, wl: Workload, config: EngineConfig,
              systems: tuple[str, ...] = tuple(SYSTEMS), repeats: int = 1,
              warmup: bool = True, progress: BenchProgress | None = None,
              ) -> tuple[dict[str, dict], dict[str, SystemResult]]:
    """Warm up and time every system ``repeats`` times in rotating order.

    ``progress`` (default: none drawn) gets a bar for the warm-up and one for each timed run
    (output tokens done / total, elapsed; its time and rate once it ends).

    Returns:
        ``(figures, last)``: per system the median of each figure over repeats, plus
        ``ratio_to_<baseline>`` of the throughput figures (the decode phase's where both
        systems measure it) to every other system, and with ``repeats > 1`` ``runs``: each
        timed run's place in the sequence (1-based) and its headline figures
        (:data:`RUN_KEYS`), so drift and noise between runs stay visible; and the last raw
        result per system (for plots).
    """
    progress = progress or BenchProgress(enabled=False)
    if warmup:
        small = wl.head(2, 4)  # constrained too: builds llguidance's tokenizer
        bar = progress.bar(f"warm-up ({plural(len(small.prompts), 'prompt')} each)",
                           len(systems) * sum(small.output_lens))
        for name in systems:
            run_system(name, model, tokenizer, small, config, bar.advance)
        bar.done("")
    runs: dict[str, list[dict]] = {s: [] for s in systems}
    order_of: dict[str, list[int]] = {s: [] for s in systems}
    last: dict[str, SystemResult] = {}
    for r in range(repeats):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        for i, name in enumerate(order):
            bar = progress.bar(f"[{r * len(systems) + i + 1}/{repeats * len(systems)}] {name}",
                               wl.num_output_tokens)
            last[name] = run_system(name, model, tokenizer, wl, config, bar.advance)
            runs[name].append(last[name].figures())
            order_of[name].append(r * len(systems) + i + 1)
            bar.done(f"{runs[name][-1]['total_tokens_per_s']:.1f} total tok/s")
    figures = {s: _median(runs[s]) for s in systems}
    if repeats > 1:
        for s in systems:
            figures[s]["runs"] = [{"run": n, **{k: f.get(k) for k in RUN_KEYS}}
                                  for n, f in zip(order_of[s], runs[s])]
    for s in systems:
        for b in systems:
            if b == s:
                continue
            for key in ("requests_per_s", "total_tokens_per_s", "output_tokens_per_s",
                        "decode_output_tokens_per_s"):
                if figures[s].get(key) and figures[b].get(key):
                    figures[s][f"{key}_ratio_to_{b}"] = figures[s][key] / figures[b][key]
    return figures, last


def _median(runs: list[dict]) -> dict:
    out = {}
    for key in runs[0]:
        vals = [r[key] for r in runs if r[key] is not None]
        numeric = all(isinstance(v, (int, float)) for v in vals)
        out[key] = (statistics.median(vals) if numeric else vals[0]) if vals else None
    out["repeats"] = len(runs)
    return out
