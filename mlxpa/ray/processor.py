"""``build_processor``: mlxpa as a ``Dataset -> Dataset`` stage, like ``ray.data.llm``'s
``build_llm_processor`` (preprocess, the engine replicas, postprocess).

Example (a local Ray instance; ``ray.init(address="auto")`` joins a cluster)::

    import ray
    from mlxpa.config import EngineConfig
    from mlxpa.ray import build_processor

    processor = build_processor(
        EngineConfig(),  # the default model; every replica loads it once
        preprocess=lambda row: {"id": row["id"], "prompt": f"Question: {row['q']}\\nAnswer:",
                                "max_tokens": 8, "stop": ["\\n"]},
        postprocess=lambda row: {"id": row["id"], "answer": row["text"], "error": row["error"]},
        num_replicas=1)
    ds = processor(ray.data.from_items([{"id": 1, "q": "What is the capital of France?"}]))
    print(ds.take_all())  # [{'id': 1, 'answer': ' Paris', 'error': None}]
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from mlxpa.config import EngineConfig
from mlxpa.ray.row_replica import RowReplica
from mlxpa.sampling_params import SamplingParams

PREFIX_KEY = "__mlxpa_prefix_key"


@dataclasses.dataclass(frozen=True)
class Processor:
    """A callable ``Dataset -> Dataset`` (see :func:`build_processor`)."""

    config: EngineConfig
    preprocess: Callable[[dict], dict] | None
    postprocess: Callable[[dict], dict] | None
    defaults: SamplingParams
    num_replicas: int
    batch_size: int
    sort_by_prefix: bool
    cpus_per_replica: float

    def __call__(self, ds: Any) -> Any:
        """Lazily add the stages to ``ds`` (a ``ray.data.Dataset``); nothing runs until the
        result is consumed."""
        from mlxpa.ray.cluster import actor_pool, configure_ray_data

        configure_ray_data()
        if self.preprocess is not None:
            ds = ds.map(self.preprocess)
        if self.sort_by_prefix:
            ds = ds.map(_with_prefix_key).sort(PREFIX_KEY)
        ds = ds.map_batches(RowReplica, batch_size=self.batch_size, batch_format="pyarrow",
                            num_cpus=self.cpus_per_replica,
                            compute=actor_pool(self.num_replicas),
                            fn_constructor_kwargs={"config": self.config,
                                                   "defaults": self.defaults,
                                                   "drop": (PREFIX_KEY,)})
        if self.postprocess is not None:
            ds = ds.map(self.postprocess)
        return ds


def build_processor(config: EngineConfig, preprocess: Callable[[dict], dict] | None = None,
                    postprocess: Callable[[dict], dict] | None = None, *,
                    defaults: SamplingParams | None = None, num_replicas: int = 1,
                    batch_size: int = 256, sort_by_prefix: bool = True,
                    cpus_per_replica: float = 1.0) -> Processor:
    """A ``Dataset -> Dataset`` callable that runs every row through mlxpa replicas.

    Each row (after ``preprocess``) is an mlxpa input row: ``prompt``, ``messages`` or
    ``prompt_token_ids``, optional ``id`` and sampling fields (``max_tokens``,
    ``temperature``, ``stop``, ``n``, ...); other columns pass through. The output has one
    row per sample: the row's columns plus ``text``, ``finish_reason``, ``prompt_tokens``,
    ``completion_tokens``, ``cached_tokens``, ``sample_index`` and ``error`` (None, or why
    the row could not run: an invalid row never stops the dataset), then ``postprocess``
    maps it.

    Args:
        config: Engine configuration of every replica (each loads the model once).
        preprocess: Maps an input row to an mlxpa row (runs as ``Dataset.map``).
        postprocess: Maps an output row to the final row.
        defaults: Sampling parameters for fields a row does not set (greedy, 256 tokens).
        num_replicas: Engine replicas (a Ray Data actor pool of this size).
        batch_size: Rows per ``map_batches`` call; a replica admits a batch's rows together,
            in radix prefix order, so this bounds its continuous batch.
        sort_by_prefix: Sort rows by their prompt (a Ray sort; text order puts rows sharing
            a prefix next to each other) so batches hold whole prefix groups. The output then
            comes in that order; without it, in the order Ray yields batches.
        cpus_per_replica: Ray CPUs each replica reserves. Leave CPUs free for the
            ``preprocess``, sort and ``postprocess`` tasks: replicas holding every CPU of the
            cluster starve them and the dataset never finishes.

    Returns:
        The :class:`Processor`.

    Raises:
        ValueError: ``num_replicas`` or ``batch_size`` below 1.
    """
    if num_replicas < 1 or batch_size < 1:
        raise ValueError(f"num_replicas and batch_size must be >= 1, got {num_replicas} and "
                         f"{batch_size}")
    return Processor(config, preprocess, postprocess, defaults or SamplingParams(),
                     num_replicas, batch_size, sort_by_prefix, cpus_per_replica)


def _with_prefix_key(row: dict) -> dict:
    """``row`` plus its sort key: the prompt, or the chat messages (the system turn first) or
    the prompt's token ids as JSON, so rows sharing a leading text sort together."""
    prompt = row.get("prompt")
    key = prompt if isinstance(prompt, str) else json.dumps(
        row.get("messages") or row.get("prompt_token_ids"), default=str)
    return {**row, PREFIX_KEY: key}


__all__ = ["Processor", "build_processor"]
