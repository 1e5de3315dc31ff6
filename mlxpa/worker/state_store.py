"""Per-request recurrent state beside the paged KV pools (hybrid and state-space models).

Layers that keep a fixed-size state instead of K/V (SSM, short convolution, gated-delta and
linear attention: mlx-lm's ``ArraysCache`` entries, e.g. a conv state plus an SSM state) cannot
be paged: their state after token ``t`` summarizes every token before it. Following vLLM's
hybrid KV cache manager, each request owns one fixed-size state per such cache entry, created
when its prefill starts (position 0) or restored from a snapshot (a prefix hit, a fork:
:meth:`RecurrentStateStore.restore`), carried from step to step (chunked prefill, decode),
and dropped when the request finishes or is preempted (a preempted request restarts from
position 0 or a hit and recomputes it).

Per step the runner asks for one ``ArraysCache`` per recurrent entry holding the group's rows
(rows without a state yet: zeros, mlx-lm's own initial state; all rows new: empty, mlx-lm's
fresh-prompt path) and stores each row's new state after the forward pass. A group's rows
have equal lengths (no padding): not every mlx-lm recurrent layer masks a padded state update
(``ArraysCache.lengths`` is honoured by some, ignored by Mamba-1 / Jamba), and decode rows
(one token each) batch anyway.
"""

from __future__ import annotations

from collections.abc import Hashable

import mlx.core as mx


class RecurrentStateStore:
    """States of every running request, per recurrent cache entry.

    Args:
        entries: Indices (in mlx-lm's cache list) of the ``ArraysCache`` entries.
        sizes: Arrays per entry (``ArraysCache(size)``).
    """

    def __init__(self, entries: list[int], sizes: list[int]) -> None:
        self.entries = list(entries)
        self.sizes = dict(zip(entries, sizes))
        # request key -> (position reached, {entry: [per-slot [1, ...] arrays or None]})
        self._states: dict[Hashable, tuple[int, dict[int, list]]] = {}

    @classmethod
    def for_geometry(cls, geometry) -> RecurrentStateStore | None:
        """A store for a probed :class:`~mlxpa.worker.model_probe.ModelGeometry`'s
        recurrent entries, or None when it has none."""
        entries = geometry.recurrent
        if not entries:
            return None
        return cls(entries, [geometry.caches[i].state_size for i in entries])

    def caches(self, keys: list[Hashable], starts: list[int], counts: list[int]) -> dict:
        """One ``ArraysCache`` per entry for a group of rows.

        Args:
            keys: Per row, the request's key.
            starts: Per row, its ``num_computed_tokens`` (0: a new state).
            counts: Per row, tokens scheduled this step.

        Raises:
            RuntimeError: A row starts past 0 without a state at exactly that position (an
                invariant of the scheduler for these models; never expected).
        """
        from mlx_lm.models.cache import ArraysCache

        rows = []
        for key, start in zip(keys, starts):
            if start == 0:
                self._states.pop(key, None)
                rows.append(None)
                continue
            pos, state = self._states.get(key, (None, None))
            if pos != start:
                raise RuntimeError(f"recurrent state of request {key!r} is at position {pos}, "
                                   f"the step starts at {start}")
            rows.append(state)
        out = {}
        for e in self.entries:
            cache = ArraysCache(self.sizes[e])
            for slot in range(self.sizes[e]):
                cache[slot] = _stack([r[e][slot] if r else None for r in rows])
            if len(set(counts)) > 1:
                raise ValueError(f"rows of one group must have equal lengths, got {counts}")
            out[e] = cache
        return out

    def save(self, keys: list[Hashable], starts: list[int], counts: list[int],
             caches: dict) -> None:
        """Keep each row's state after the step (``[1, ...]`` slices of the group's arrays)."""
        for row, key in enumerate(keys):
            state = {e: [None if a is None else a[row:row + 1] for a in c.cache]
                     for e, c in caches.items()}
            self._states[key] = (starts[row] + counts[row], state)

    def arrays(self) -> list[mx.array]:
        """Every stored array (to evaluate with the step)."""
        return [a for _, st in self._states.values() for slots in st.values()
                for a in slots if a is not None]

    def state(self, key: Hashable) -> dict:
        """``key``'s state (per entry, its ``[1, ...]`` arrays)."""
        return self._states[key][1]

    def restore(self, key: Hashable, position: int, state: dict) -> None:
        """Give ``key`` the state ``state`` (per entry, ``[1, ...]`` arrays) at ``position``."""
        self._states[key] = (position, state)

    def drop(self, keys: list[Hashable]) -> None:
        """Forget the states of ``keys`` (finished requests)."""
        for key in keys:
            self._states.pop(key, None)

    def keys(self) -> list[Hashable]:
        return list(self._states)


def _stack(per_row: list[mx.array | None]) -> mx.array | None:
    """Rows' ``[1, ...]`` arrays concatenated; zeros for rows without one; None when none has."""
    template = next((a for a in per_row if a is not None), None)
    if template is None:
        return None
    return mx.concatenate([a if a is not None else mx.zeros_like(template) for a in per_row])
