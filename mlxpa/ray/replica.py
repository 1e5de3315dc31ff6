"""Ray Data replicas: callable classes that own one :class:`~mlxpa.engine.LLMEngine` each.

Ray Data builds the class once per actor (``map_batches(ShardReplica, compute=
ActorPoolStrategy(size=N))``), so each replica loads the model once and keeps its prefix cache
across the shards it is given. A shard's results leave the actor only when the whole shard is
done (one returned block), so when Ray restarts a killed actor and retries its task, no row is
lost and none is written twice.
"""

from __future__ import annotations

import os
import pickle
import socket
import time
from typing import Any

import numpy as np

from mlxpa.config import EngineConfig
from mlxpa.core.prefix_order import prefix_order
from mlxpa.data.inputs import where
from mlxpa.data.records import result_records
from mlxpa.engine import LLMEngine, PromptInput
from mlxpa.ray.items import Item
from mlxpa.ray.stats import delta, snapshot
from mlxpa.request import RequestOutput

STATS_INDEX = -1  # the index of the row that carries a shard's counters


class ReplicaEngine:
    """One engine replica (the state a Ray actor keeps between batches).

    Args:
        config: Engine configuration; the model loads here, once per actor.
    """

    def __init__(self, config: EngineConfig) -> None:
        start = time.perf_counter()
        self.engine = LLMEngine(config)
        self.load_s = time.perf_counter() - start
        self.replica = _actor_name()
        self.process = f"{socket.gethostname()}:{os.getpid()}"

    def run(self, items: list[Item]) -> tuple[dict[int, list[RequestOutput]], dict[str, Any]]:
        """Run ``items`` to completion, admitted in prefix order.

        Returns:
            The outputs of each item's index (one per sample, in sample order), and what the
            engine's counters gained (:func:`mlxpa.ray.stats.delta`; ``failed_rows`` counts
            items whose output is an error).
        """
        c = self.engine.counters
        before = snapshot(c)
        order = prefix_order([it.prompt_token_ids for it in items], self.engine.config.block_size)
        prompts = (PromptInput(items[i].index, items[i].prompt_token_ids, items[i].params,
                               items[i].row.id) for i in order)
        outs: dict[int, list[RequestOutput]] = {}
        for out in self.engine.generate(prompts):
            outs.setdefault(out.request_id, []).append(out)
        for group in outs.values():
            group.sort(key=lambda o: o.sample_index)
            c.failed_rows += any(o.error is not None for o in group)
        return outs, delta(c, before, self.replica, self.process, self.load_s)


class ShardReplica(ReplicaEngine):
    """``mlxpa run --ray``'s replica: a batch holds pickled shards (lists of
    :class:`~mlxpa.ray.items.Item`); it returns, per shard, one row per item (``index``, and
    ``payload``: the pickled result records a local run writes for it) and one row with index
    ``STATS_INDEX`` whose payload is the shard's counters delta.

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

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        index, payload = [], []
        for blob in batch["payload"]:
            items: list[Item] = pickle.loads(blob)
            outs, stats = self.run(items)
            for it in items:
                place = where(self.source, it.row.line, self.unit)
                records = result_records(it.row, outs[it.index], self.out_fmt, self.model_name,
                                         place)
                index.append(it.index)
                payload.append(pickle.dumps(records))
            index.append(STATS_INDEX)
            payload.append(pickle.dumps(stats))
        blobs = np.empty(len(payload), dtype=object)
        blobs[:] = payload
        return {"index": np.array(index, dtype=np.int64), "payload": blobs}


def _actor_name() -> str:
    """The Ray actor id (kept across restarts), or ``host:pid`` outside an actor."""
    try:
        import ray

        actor = ray.get_runtime_context().get_actor_id()
    except Exception:  # not inside Ray (tests build a replica directly)
        actor = None
    return actor or f"{socket.gethostname()}:{os.getpid()}"
