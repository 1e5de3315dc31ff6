"""``mlxpa run --ray``: the local run's rows, ids, error rows and order, on N Ray replicas.

Data flow (one way)::

    Source.open(input), validate_input   pass 1 on the driver, as a local run's (no model)
    rows_to_requests(source) -> windows  pass 2 on the driver: rows to requests (tokenizer
                                         only); skipped and invalid rows go to the writer
    plan_shards per window               radix prefix order, cut between prefix groups
    ActorPool(ShardReplica actors)       a shard at a time per replica, at most two windows
        -> (index, records) per row + the shard's counters
    ResultWriter (reorder buffer: input order, flushed as rows finish; JSONL --resume works)
    final_report

The driver streams as a local run does (:mod:`mlxpa.ray.driver`): its memory does not grow
with the input.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console

from mlxpa.batch.model_meta import ModelMeta
from mlxpa.batch.options import RunOptions, check_targets
from mlxpa.batch.report import final_report
from mlxpa.batch.requests import rows_to_requests
from mlxpa.batch.source import Source
from mlxpa.batch.validation import Validated, validate_input
from mlxpa.config import EngineConfig
from mlxpa.data import InputOptions, ResultWriter
from mlxpa.engine.metrics import summarize
from mlxpa.engine.progress import RunProgress
from mlxpa.engine.stream import windows
from mlxpa.ray.cluster import ray_session, require_ray
from mlxpa.ray.driver import ShardFeeder, shard_rows, start_replicas
from mlxpa.ray.options import RayOptions
from mlxpa.ray.stats import ClusterCounters, cluster_metrics
from mlxpa.sampling_params import SamplingParams

__all__ = ["RayOptions", "run_file_ray"]


def run_file_ray(source: str, output: str, config: EngineConfig, defaults: SamplingParams,
                 options: RunOptions | None = None, ray: RayOptions | None = None, *,
                 inputs: InputOptions | None = None, console: Console | None = None,
                 should_stop: Callable[[], bool] | None = None) -> dict:
    """Run every row of ``source`` on Ray engine replicas; write ``output``.

    The arguments shared with :func:`mlxpa.batch.run.run_file` mean the same; the output is
    what a local run writes (same rows, ids, error rows, order; greedy texts identical).

    Returns:
        The ``--metrics-json`` dict: a local run's keys, ``peak_kv_blocks`` as a list (one
        per replica), ``num_replicas``, ``replica_load_s``, ``replica_processes``,
        ``ray_init_s``, ``driver_s`` (the driver's validation, reading, tokenization and
        sharding), ``num_shards``.

    Raises:
        InputError, OptionError, ValueError: As :func:`mlxpa.batch.run.run_file`, before Ray
            starts; ValueError also when Ray is not installed.
        TimeoutError: The replicas did not start (the cluster lacks the CPUs).
    """
    options, ray, inputs = options or RunOptions(), ray or RayOptions(), inputs or InputOptions()
    check_targets(source, output, options)
    require_ray()
    console = console or Console(stderr=True)
    should_stop = should_stop or (lambda: False)
    start = time.perf_counter()
    model, cluster = ModelMeta(config), ClusterCounters()
    extra = {"num_replicas": ray.num_replicas, "ray_init_s": 0.0, "driver_s": 0.0,
             "num_shards": 0}
    with Source.open(source, inputs) as src:
        p = validate_input(src, output, defaults, options, console,
                           vocab_size=model.vocab_size(), tokenizer=model.tokenizer_or_none)
        with ResultWriter(output, ordered=options.ordered, append=options.resume,
                          positions=p.validation.done) as writer:
            if p.num_to_run:
                fed = rows_to_requests(src, p.validation, defaults,
                                       model.input_processor(src.inputs))
                extra["driver_s"] = time.perf_counter() - start
                with ray_session(ray.address) as init_s:
                    extra["ray_init_s"] = init_s
                    driver_s, extra["num_shards"] = _execute(
                        fed, src, p, config, writer, cluster, ray, options, console,
                        should_stop)
                    extra["driver_s"] += driver_s
            writer.close(reorder=not should_stop())  # a stopped run: the next resume sorts
    stats = summarize(cluster.counters)
    metrics = cluster_metrics(stats, cluster, extra)
    final_report(stats, console, options, metrics=metrics, note=(
        f"replicas {metrics['num_replicas']}: peak KV blocks {metrics['peak_kv_blocks']}, "
        f"model load {[round(s, 1) for s in metrics['replica_load_s']]} s; Ray start-up "
        f"{metrics['ray_init_s']:.1f} s, driver {metrics['driver_s']:.1f} s, "
        f"{metrics['num_shards']} shards"))
    return metrics


def _execute(fed, src: Source, p: Validated, config: EngineConfig, writer: ResultWriter,
             cluster: ClusterCounters, opts: RayOptions, options: RunOptions,
             console: Console, should_stop: Callable[[], bool]) -> tuple[float, int]:
    """Start the replicas and feed them the input's windows; returns the driver's seconds in
    this pass (reading, tokenizing, sharding) and the number of shards."""
    import ray

    v = p.validation
    rows = shard_rows(opts, config, p.num_to_run - v.num_problems)
    size = max(options.window, 2 * opts.num_replicas * rows)  # every replica gets shards
    actors = start_replicas(config, opts, p.out_fmt, src)
    try:
        c = cluster.counters
        c.start_time = time.perf_counter()
        with RunProgress(p.num_to_run, c, console, options.show_progress) as progress:
            feeder = ShardFeeder(actors, writer, p.out_fmt, cluster, progress,
                                 (config.block_size, rows, opts.sharding or options.order,
                                  config.seed))
            feeder.run(windows(fed, size), should_stop)
    finally:
        for actor in actors:
            ray.kill(actor)
    return feeder.driver_s, feeder.num_shards
