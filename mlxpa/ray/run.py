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

import json
import math
import os
import pickle
import time
from collections.abc import Callable

from rich.console import Console

from mlxpa.config import EngineConfig, SamplingParams
from mlxpa.data import InputOptions, ResultWriter
from mlxpa.data.records import error_records
from mlxpa.data.resume import id_key
from mlxpa.data.rows import where
from mlxpa.engine.metrics import Stats, summarize
from mlxpa.progress import RunProgress, summary_table
from mlxpa.ray.cluster import actor_pool, configure_ray_data, ray_session, require_ray
from mlxpa.ray.items import Item, make_item
from mlxpa.ray.prepare import Prepared, check_targets, prepare
from mlxpa.ray.replica import STATS_INDEX, ShardReplica
from mlxpa.ray.shard import SHARDINGS, plan_shards
from mlxpa.ray.stats import ClusterCounters, cluster_metrics


def run_file_ray(source: str, output: str, config: EngineConfig, defaults: SamplingParams, *,
                 inputs: InputOptions | None = None, output_fmt: str = "auto",
                 sharding: str = "prefix", ordered: bool = True, skip_invalid: bool = False,
                 resume: bool = False, metrics_json: str | None = None,
                 console: Console | None = None, show_progress: bool = True,
                 should_stop: Callable[[], bool] | None = None, address: str | None = None,
                 num_replicas: int = 1, shard_rows: int | None = None,
                 cpus_per_replica: float = 1.0) -> dict:
    """Run every row of ``source`` on ``num_replicas`` Ray Data replicas; write ``output``.

    The arguments shared with :func:`mlxpa.run.run_file` mean the same; the output is what a
    local run writes (same rows, ids, error rows, order; greedy texts identical).

    Args:
        sharding: ``prefix`` (rows sharing a prefix go to one replica, in radix order),
            ``input`` (file order) or ``random`` (a baseline); see
            :func:`mlxpa.ray.shard.plan_shards`.
        address: Ray cluster address (``auto``, ``ray://host:10001``); None starts a local
            Ray instance.
        num_replicas: Engine replicas (Ray actors; each loads the model once).
        shard_rows: Rows per shard (one Ray task); None: the rows to run over twice the
            replicas, at most ``4 * max_num_seqs`` (so each engine batches fully and the
            pool still balances).
        cpus_per_replica: Ray CPUs each replica reserves.

    Returns:
        The ``--metrics-json`` dict: a local run's keys, ``peak_kv_blocks`` as a list (one
        per replica), ``num_replicas``, ``replica_load_s``, ``replica_processes``,
        ``ray_init_s``, ``driver_s`` (validation, tokenization, sharding), ``num_shards``.

    Raises:
        InputError, ValueError: As :func:`mlxpa.run.run_file`, before Ray starts.
    """
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding must be one of {', '.join(SHARDINGS)}, got {sharding!r}")
    if num_replicas < 1:
        raise ValueError(f"--num-replicas must be >= 1, got {num_replicas}")
    check_targets(output, metrics_json, resume)
    require_ray()
    console = console or Console(stderr=True)
    start = time.perf_counter()
    p = prepare(source, output, defaults, inputs or InputOptions(), output_fmt, skip_invalid,
                resume, console)
    inputs = inputs or InputOptions()
    cluster = ClusterCounters()
    extra = {"num_replicas": num_replicas, "ray_init_s": 0.0, "driver_s": 0.0, "num_shards": 0}
    try:
        with ResultWriter(output, ordered=ordered, append=resume) as writer:
            if p.validation.num_rows > p.validation.num_done:
                items = _items(p, inputs, config, defaults, writer, cluster)
                rows = shard_rows or max(1, min(math.ceil(len(items) / (2 * num_replicas)),
                                                4 * config.max_num_seqs))
                shards = plan_shards([it.prompt_token_ids for it in items], config.block_size,
                                     rows, sharding, config.seed)
                extra.update(driver_s=time.perf_counter() - start, num_shards=len(shards))
                with ray_session(address) as init_s:
                    extra["ray_init_s"] = init_s
                    _execute(p, config, [[items[i] for i in s] for s in shards], writer,
                             cluster, num_replicas, cpus_per_replica, console,
                             show_progress, should_stop or (lambda: False))
    finally:
        if p.spooled:
            os.remove(p.path)
    stats = summarize(cluster.counters)
    metrics = cluster_metrics(stats, cluster, extra)
    _report(stats, metrics, console, show_progress, metrics_json)
    return metrics


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


def _items(p: Prepared, inputs: InputOptions, config: EngineConfig, defaults: SamplingParams,
           writer: ResultWriter, cluster: ClusterCounters) -> list[Item]:
    """Pass 2 on the driver: an :class:`Item` per row to run; rows already done are skipped
    in ``writer`` and rows that cannot run get their error rows there now."""
    from mlx_lm.utils import load_tokenizer

    from mlxpa.loader.models import resolve_model

    tokenizer = load_tokenizer(resolve_model(config.model))
    v, items = p.validation, []
    for row in inputs.read(p.path, p.fmt, p.name):
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
             cluster: ClusterCounters, num_replicas: int, cpus: float, console: Console,
             show_progress: bool, should_stop: Callable[[], bool]) -> None:
    """Run the shards on the actor pool; write each row as its shard comes back."""
    import ray

    configure_ray_data(wait_for_replicas=True)
    ds = ray.data.from_items([{"payload": pickle.dumps(s)} for s in shards],
                             override_num_blocks=len(shards))
    ds = ds.map_batches(ShardReplica, batch_size=1, num_cpus=cpus,
                        compute=actor_pool(num_replicas),
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
