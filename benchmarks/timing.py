"""One timing helper the step benchmarks share (imported as a sibling module, as ``rss``)."""

import time

import mlx.core as mx


def seconds(fn, reps: int = 3) -> float:
    """The fastest of ``reps`` evaluations of ``fn()``'s lazy result, in seconds."""
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        mx.eval(fn())
        ts.append(time.perf_counter() - t0)
    return min(ts)
