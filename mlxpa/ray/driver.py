"""The Ray driver's pass 2 (``mlxpa run --ray``): pass 2's windows of rows
(:func:`~mlxpa.batch.requests.rows_to_requests`), each cut into prefix-aware shards
(:func:`~mlxpa.ray.shard.plan_shards`) and fed to a pool of replica actors
(:class:`~mlxpa.ray.replica.ShardReplica`, one shard at a time each); results go to the
writer as shards return.

The driver's memory does not grow with the input: it reads the next window only once every
shard of the window before the current one has returned, so at most two windows of rows are in
flight and the writer's reorder buffer holds at most about two windows of results. Ray Data's
``from_items`` takes every row up front and its file readers lose what mlxpa's readers promise
(line numbers, error rows, duplicate ids, OpenAI Batch lines, ``--resume`` skips), so the
driver feeds Ray Core actors itself (``ray.util.ActorPool``, the layer under Ray Data's actor
pools). Ray restarts a replica whose process dies and runs its shard again
(``max_restarts``/``max_task_retries``); a shard's results leave the actor only when the whole
shard is done, so no row is lost or written twice.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from mlxpa.batch.job import write_unrunnable
from mlxpa.batch.report import model_name
from mlxpa.batch.requests import RowRequest
from mlxpa.batch.source import Source
from mlxpa.config import EngineConfig
from mlxpa.data import ResultWriter
from mlxpa.engine.progress import RunProgress
from mlxpa.ray.options import RayOptions
from mlxpa.ray.replica import ShardReplica
from mlxpa.ray.shard import plan_shards
from mlxpa.ray.stats import ClusterCounters

WAIT_FOR_REPLICAS_S = 600  # for every replica to load its model before the first shard
POLL_S = 0.5  # the longest wait for a shard before the stop request is polled again


def start_replicas(config: EngineConfig, opts: RayOptions, out_fmt: str,
                   src: Source) -> list[Any]:
    """Start ``opts.num_replicas`` replica actors and wait until each has loaded the model
    (so the first shards spread over all of them).

    Raises:
        TimeoutError: They did not all start within :data:`WAIT_FOR_REPLICAS_S` (the cluster
            lacks the CPUs).
    """
    import ray

    actor = ray.remote(ShardReplica).options(num_cpus=opts.cpus_per_replica, max_restarts=-1,
                                             max_task_retries=-1)
    actors = [actor.remote(config, out_fmt, model_name(config.model), src.name, src.unit)
              for _ in range(opts.num_replicas)]
    ready, _ = ray.wait([a.ready.remote() for a in actors], num_returns=len(actors),
                        timeout=WAIT_FOR_REPLICAS_S)
    if len(ready) < len(actors):
        for a in actors:
            ray.kill(a)
        raise TimeoutError(f"--ray: {len(ready)} of {len(actors)} replicas started in "
                           f"{WAIT_FOR_REPLICAS_S} s; the cluster lacks the CPUs "
                           f"({opts.cpus_per_replica} per replica)")
    ray.get(ready)  # a replica that failed to load raises here
    return actors


def shard_rows(opts: RayOptions, config: EngineConfig, num_rows: int) -> int:
    """Rows per shard: ``opts.shard_rows``, else ``num_rows`` (the rows that will run) over
    twice the replicas, at most ``4 * max_num_seqs``."""
    return opts.shard_rows or max(1, min(math.ceil(num_rows / (2 * opts.num_replicas)),
                                         4 * config.max_num_seqs))


class ShardFeeder:
    """Feeds windows of rows to the replicas and writes what returns.

    Args:
        actors: The replica actors (:func:`start_replicas`).
        writer: Where the result and error rows go.
        out_fmt: ``mlxpa`` or ``openai`` records (for the driver's error rows).
        cluster: The counters summed over replicas (the driver's error rows count there).
        progress: The progress bar (rows).
        plan: ``(block_size, shard_rows, sharding, seed)`` for
            :func:`~mlxpa.ray.shard.plan_shards`.
    """

    def __init__(self, actors: list[Any], writer: ResultWriter, out_fmt: str,
                 cluster: ClusterCounters, progress: RunProgress,
                 plan: tuple[int, int, str, int]) -> None:
        from ray.util import ActorPool

        self.pool = ActorPool(actors)
        self.writer, self.out_fmt, self.cluster, self.progress = writer, out_fmt, cluster, progress
        self.plan = plan
        self.open: dict[int, int] = {}  # window number -> its shards not yet returned
        self.num_shards = 0
        self.driver_s = 0.0  # reading, tokenizing and sharding

    def run(self, windows: Iterable[list[RowRequest]], should_stop: Callable[[], bool]) -> None:
        """Run every window's rows (stops between shards once ``should_stop`` is true)."""
        start = time.perf_counter()
        for k, window in enumerate(windows):
            self._submit(k, window)
            self.driver_s += time.perf_counter() - start
            while len(self.open) > 1 and not should_stop():
                self._collect()
            if should_stop():
                return
            start = time.perf_counter()
        while self.pool.has_next() and not should_stop():
            self._collect()

    def _submit(self, key: int, window: list[RowRequest]) -> None:
        """The window's error rows written, its done rows skipped, its shards submitted."""
        runs = write_unrunnable(window, self.writer, self.out_fmt, self.cluster.counters)
        self.progress.advance(sum(rr.error is not None for rr in window))
        block_size, rows, sharding, seed = self.plan
        shards = plan_shards([rr.request.prompt_token_ids for rr in runs], block_size, rows,
                             sharding, seed, [rr.request.cache_salt for rr in runs])
        for shard in shards:
            self.pool.submit(lambda a, v: a.run_shard.remote(*v),
                             (key, [runs[i] for i in shard]))
        if shards:
            self.open[key] = len(shards)
        self.num_shards += len(shards)

    def _collect(self) -> None:
        """Write the next shard that returns (waits at most :data:`POLL_S`)."""
        try:
            key, records, stats = self.pool.get_next_unordered(timeout=POLL_S)
        except TimeoutError:
            return
        self.cluster.add(stats)
        for index, recs in records:
            self.writer.add(index, recs)
        self.progress.advance(len(records))
        self.open[key] -= 1
        if not self.open[key]:
            del self.open[key]
