"""Ray replicas: classes that own one :class:`~mlxpa.engine.LLMEngine` each.

Ray builds one per actor, so each replica loads the model once and keeps its prefix cache
across the shards (``mlxpa run --ray``) or batches (``build_processor``) it is given. A shard's
results leave the actor only when the whole shard is done (one return value), so when Ray
restarts a killed actor and runs its task again, no row is lost and none is written twice.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from mlxpa.batch.requests import RowRequest
from mlxpa.config import EngineConfig
from mlxpa.data.reader_options import where
from mlxpa.data.records import result_records
from mlxpa.engine import LLMEngine
from mlxpa.engine.stream import RequestStream
from mlxpa.ray.stats import delta, snapshot
from mlxpa.request import SampleOutput


class ReplicaEngine:
    """One engine replica (the state a Ray actor keeps between tasks).

    Args:
        config: Engine configuration; the model loads here, once per actor.
    """

    def __init__(self, config: EngineConfig) -> None:
        start = time.perf_counter()
        self.engine = LLMEngine(config)
        self.load_s = time.perf_counter() - start
        self.replica = _actor_name()
        self.process = f"{socket.gethostname()}:{os.getpid()}"

    def run(self, rows: list[RowRequest]) -> tuple[dict[int, list[SampleOutput]], dict[str, Any]]:
        """Run ``rows`` (each with its request) to completion, admitted in prefix order
        (:class:`~mlxpa.engine.stream.RequestStream`, the rows as one window).

        Returns:
            The outputs of each row index (one per sample, in sample order), and what the
            engine's counters gained (:func:`mlxpa.ray.stats.delta`; ``failed_rows`` counts
            rows whose output is an error).
        """
        c = self.engine.counters
        before = snapshot(c)
        outs: dict[int, list[SampleOutput]] = {}
        for rr, group in RequestStream(self.engine).run([rows]):
            outs[rr.row.index] = group
            c.failed_rows += any(o.error is not None for o in group)
        return outs, delta(c, before, self.replica, self.process, self.load_s)


class ShardReplica(ReplicaEngine):
    """``mlxpa run --ray``'s replica, a Ray actor: :meth:`run_shard` runs one shard of rows
    and returns the result records a local run writes for each.

    Args:
        config: Engine configuration.
        out_fmt: ``mlxpa`` or ``openai`` records.
        model_name: Model name for OpenAI output lines.
        source: The input's display name (for run-time error messages).
        unit: ``line`` or ``row``.
    """

    def __init__(self, config: EngineConfig, out_fmt: str, model_name: str, source: str,
                 unit: str) -> None:
        super().__init__(config)
        self.out_fmt, self.model_name, self.source, self.unit = out_fmt, model_name, source, unit

    def ready(self) -> str:
        """The replica's process (``host:pid``), once its model has loaded."""
        return self.process

    def run_shard(self, key: Any, shard: list[RowRequest],
                  ) -> tuple[Any, list[tuple[int, list[dict]]], dict[str, Any]]:
        """Run ``shard`` (rows with their requests) to completion.

        Returns:
            ``key``, each row's index with its result records, and the shard's counters
            delta (:func:`mlxpa.ray.stats.delta`).
        """
        outs, stats = self.run(shard)
        records = [(rr.row.index, result_records(
            rr.row, outs[rr.row.index], self.out_fmt, self.model_name,
            where(self.source, rr.row.line, self.unit), self.engine.tokenizer))
            for rr in shard]
        return key, records, stats


def _actor_name() -> str:
    """The Ray actor id (kept across restarts), or ``host:pid`` outside an actor."""
    try:
        import ray

        actor = ray.get_runtime_context().get_actor_id()
    except Exception:  # not inside Ray (tests build a replica directly)
        actor = None
    return actor or f"{socket.gethostname()}:{os.getpid()}"
