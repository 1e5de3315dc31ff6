"""Where and how wide a ``mlxpa run --ray`` goes (:class:`RayOptions`)."""

from __future__ import annotations

import dataclasses

from mlxpa.ray.shard import SHARDINGS


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
