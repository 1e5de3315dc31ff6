"""``mlxpa run --ray``: the local run's rows, ids, error rows and order, on N Ray replicas.

Data flow (one way)::

    prepare(input)                      pass 1 on the driver: validation, --resume (no model)
    read_rows(input) -> make_item       pass 2 on the driver: tokenize (tokenizer only);
                                        skipped and invalid rows go to the writer directly
    plan_shards                         radix prefix order, cut between prefix groups
    ray.data.from_items(shards)
        .map_batches(ShardReplica, batch_size=1, compute=ActorPoolStrategy(size=N))
        -> (index, pickled records) rows + one counters row per shard
    ResultWriter (reorder buffer: input order, flushed as rows finish; JSONL --resume works)

The driver holds every row's prompt token ids (the shards) in memory; the replicas stream.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import time
from collections.abc import Callable

from rich.console import Console

from mlxpa.batch.progress import RunProgress, summary_table
from mlxpa.batch.run import RunOptions, check_targets
from mlxpa.config import EngineConfig, SamplingParams
from mlxpa.data import InputOptions, ResultWriter
from mlxpa.data.inputs import where
from mlxpa.data.records import error_records
from mlxpa.data.resume import id_key
from mlxpa.engine.metrics import Stats, summarize
from mlxpa.ray.cluster import actor_pool, configure_ray_data, ray_session, require_ray
from mlxpa.ray.items import Item, make_item
from mlxpa.ray.prepare import Prepared, prepare
from mlxpa.ray.replica import STATS_INDEX, ShardReplica
from mlxpa.ray.shard import SHARDINGS, plan_shards
from mlxpa.ray.stats import ClusterCounters, cluster_metrics


@dataclasses.dataclass(frozen=True, slots=True)
class RayOptions:
    """Where and how wide a Ray run goes.

    Attributes:
        address: Ray cluster address (``auto``: the one ``ray start --head`` started;
            ``ray://host:10001``); None starts a local Ray instance.
        num_replicas: Engine replicas (Ray actors; each loads the model once).
        sharding: ``prefix``, ``input`` or ``random`` (see
            :func:`mlxpa.ray.shard.plan_shards`); None follows the run's ``order``.
        shard_rows: Rows per shard (one Ray task); None: the rows to run over twice the
            replicas, at most ``4 * max_num_seqs`` (so each engine batches fully and the
            pool still balances).
        cpus_per_replica: Ray CPUs each replica reserves.

    Raises:
        ValueError: ``num_replicas`` below 1 or an unknown ``sharding``.
    """

    address: str | None = None
    num_replicas: int = 1
    sharding: str | None = None
    shard_rows: int | None = None
    cpus_per_replica: float = 1.0

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError(f"--num-replicas must be >= 1, got {self.num_replicas}")
        if self.sharding is not None and self.sharding not in SHARDINGS:
            raise ValueError(f"sharding must be one of {', '.join(SHARDINGS)}, "
                             f"got {self.sharding!r}")


def run_file_ray(source: str, output: str, config: EngineConfig, defaults: SamplingParams,
                 options: RunOptions | None = None, ray: RayOptions | None = None, *,
                 inputs: InputOptions | None = None, console: Console | None = None,
                 should_stop: Callable[[], bool] | None = None) -> dict:
    """Run every row of ``source`` on Ray Data engine replicas; write ``output``.

    The arguments shared with :func:`mlxpa.batch.run.run_file` mean the same; the output is what a
    local run writes (same rows, ids, error rows, order; greedy texts identical).

    Returns:
        The ``--metrics-json`` dict: a local run's keys, ``peak_kv_blocks`` as a list (one
        per replica), ``num_replicas``, ``replica_load_s``, ``replica_processes``,
        ``ray_init_s``, ``driver_s`` (validation, tokenization, sharding), ``num_shards``.

    Raises:
        InputError, OptionError, ValueError: As :func:`mlxpa.batch.run.run_file`, before Ray
            starts; ValueError also when Ray Data is not installed.
    """
    options, ray, inputs = options or RunOptions(), ray or RayOptions(), inputs or InputOptions()
    check_targets(source, output, options)
    require_ray()
    console = console or Console(stderr=True)
    start = time.perf_counter()
    p = prepare(source, output, defaults, inputs, options, console)
    cluster = ClusterCounters()
    extra = {"num_replicas": ray.num_replicas, "ray_init_s": 0.0, "driver_s": 0.0,
             "num_shards": 0}
    try:
        should_stop = should_stop or (lambda: False)
        with ResultWriter(output, ordered=options.ordered, append=options.resume,
                          positions=p.validation.done) as writer:
            if p.validation.num_rows > p.validation.num_done:
                items = _items(p, config, defaults, writer, cluster)
                shards = _shards(items, config, ray, options.order)
                extra.update(driver_s=time.perf_counter() - start, num_shards=len(shards))
                with ray_session(ray.address) as init_s:
                    extra["ray_init_s"] = init_s
                    _execute(p, config, shards, writer, cluster, ray, console,
                             options.show_progress, should_stop)
            writer.close(reorder=not should_stop())  # a stopped run: the next resume sorts
    finally:
        if p.spooled:
            os.remove(p.path)
    stats = summarize(cluster.counters)
    metrics = cluster_metrics(stats, cluster, extra)
    _report(stats, metrics, console, options.show_progress, options.metrics_json)
    return metrics


def _shards(items: list[Item], config: EngineConfig, ray: RayOptions,
            order: str) -> list[list[Item]]:
    """The items cut into shards (:func:`~mlxpa.ray.shard.plan_shards`)."""
    rows = ray.shard_rows or max(1, min(math.ceil(len(items) / (2 * ray.num_replicas)),
                                        4 * config.max_num_seqs))
    plan = plan_shards([it.prompt_token_ids for it in items], config.block_size, rows,
                       ray.sharding or order, config.seed)
    return [[items[i] for i in s] for s in plan]


def _report(stats: Stats, metrics: dict, console: Console, show_progress: bool,
            metrics_json: str | None) -> None:
    """The final report (a local run's table, then the replicas' line) and ``--metrics-json``."""
    if show_progress:
        console.print(summary_table(stats))
        console.print(f"replicas {metrics['num_replicas']}: peak KV blocks "
                      f"{metrics['peak_kv_blocks']}, model load "
                      f"{[round(s, 1) for s in metrics['replica_load_s']]} s; Ray start-up "
                      f"{metrics['ray_init_s']:.1f} s, driver {metrics['driver_s']:.1f} s, "
                      f"{metrics['num_shards']} shards", markup=False, highlight=False)
    if show_progress and stats.failed_rows:
        console.print(f"warning: {stats.failed_rows} row(s) failed; their output rows "
                      "carry an error field", style="yellow", highlight=False, soft_wrap=True)
    if metrics_json:
        with open(metrics_json, "w") as f:
            json.dump(metrics, f, indent=2)


def _items(p: Prepared, config: EngineConfig, defaults: SamplingParams, writer: ResultWriter,
           cluster: ClusterCounters) -> list[Item]:
    """Pass 2 on the driver: an :class:`Item` per row to run; rows already done are skipped
    in ``writer`` and rows that cannot run get their error rows there now."""
    from mlx_lm.utils import load_tokenizer

    from mlxpa.loader.models import resolve_model

    tokenizer = load_tokenizer(resolve_model(config.model))
    v, items = p.validation, []
    for row in p.rows():
        if row.id is not None and id_key(row.id) in v.done:
            writer.skip(row.index)
            continue
        place = where(p.name, row.line, p.unit)
        error = row.error or v.row_problems.get(row.index)
        item = make_item(row, defaults, tokenizer, place) if error is None else error
        if isinstance(item, str):
            cluster.counters.failed_rows += 1
            writer.add(row.index, error_records(row, item, p.out_fmt))
            continue
        items.append(item)
    return items


def _execute(p: Prepared, config: EngineConfig, shards: list[list[Item]], writer: ResultWriter,
             cluster: ClusterCounters, opts: RayOptions, console: Console,
             show_progress: bool, should_stop: Callable[[], bool]) -> None:
    """Run the shards on the actor pool; write each row as its shard comes back."""
    import ray

    configure_ray_data(wait_for_replicas=True)
    ds = ray.data.from_items([{"payload": pickle.dumps(s)} for s in shards],
                             override_num_blocks=len(shards))
    ds = ds.map_batches(ShardReplica, batch_size=1, num_cpus=opts.cpus_per_replica,
                        compute=actor_pool(opts.num_replicas),
                        fn_constructor_kwargs={"config": config, "out_fmt": p.out_fmt,
                                               "model_name": _model_name(config.model),
                                               "source": p.name, "unit": p.unit})
    total = sum(map(len, shards)) + cluster.counters.failed_rows
    c = cluster.counters
    c.start_time = time.perf_counter()
    seen: set[int] = set()
    with RunProgress(total, c, console, show_progress) as progress:
        progress.advance(c.failed_rows)
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            done = 0
            for index, blob in zip(batch["index"].tolist(), batch["payload"]):
                if index == STATS_INDEX:
                    cluster.add(pickle.loads(blob))
                elif index not in seen:  # a task runs again only if its result was lost
                    seen.add(index)
                    writer.add(index, pickle.loads(blob))
                    done += 1
            progress.advance(done)
            if should_stop():
                break


def _model_name(spec: str | None) -> str:
    from mlxpa.loader.models import DEFAULT_MODEL_NAME

    return os.path.basename(os.path.normpath(spec)) if spec else DEFAULT_MODEL_NAME
