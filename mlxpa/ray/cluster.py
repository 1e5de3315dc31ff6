"""Connect to a Ray cluster for one run, or start a local Ray instance; Ray Data settings of
``build_processor``."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator


def require_ray() -> None:
    """Raise ValueError with the install command when Ray Data is not installed."""
    try:
        import ray.data  # noqa: F401
    except ImportError:
        raise ValueError("--ray needs Ray Data: pip install 'mlxpa[ray]' "
                         "(or pip install 'ray[data]')") from None


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[float]:
    """Use the Ray instance this process already joined, else ``ray.init`` one (and shut it
    down on exit).

    Args:
        address: A cluster to join (``auto``: the one ``ray start --head`` started on this
            machine; ``ray://host:10001``: Ray Client); None starts a local Ray instance.
        num_cpus: CPUs of a local instance (None: all); ignored when joining a cluster.

    Yields:
        Seconds ``ray.init`` took (0 when Ray was already initialized).

    Raises:
        ConnectionError: ``address`` cannot be reached (from ``ray.init``).
    """
    import ray

    if ray.is_initialized():
        yield 0.0
        return
    start = time.perf_counter()
    kwargs = {"include_dashboard": False, "log_to_driver": False,
              "logging_level": logging.WARNING}
    if address is None and num_cpus is not None:
        kwargs["num_cpus"] = num_cpus
    ray.init(address=address, **kwargs)
    try:
        yield time.perf_counter() - start
    finally:
        ray.shutdown()


def actor_pool(num_replicas: int):
    """A fixed Ray Data pool of ``num_replicas`` actors, each given one batch at a time, so a
    free replica takes the next one (load balance) instead of one replica queueing them."""
    import ray

    return ray.data.ActorPoolStrategy(size=num_replicas, max_tasks_in_flight_per_actor=1)


def configure_ray_data() -> None:
    """Set the current Ray ``DataContext``: no Ray Data progress bars or execution logs on
    stderr (mlxpa draws its own)."""
    import ray

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.enable_auto_log_stats = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)
