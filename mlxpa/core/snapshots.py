"""Recurrent snapshots of requests: where a request's state is due, what each step saves and
restores, and a fork's snapshot kept for its children.

Pure Python (no mlx); the KV cache manager's bookkeeping for hybrid and state-space models
(:mod:`mlxpa.core.kv_cache_manager`). A snapshot is the state of every recurrent layer of one
request at one position, stored in ``snapshot_blocks`` blocks of the KV pool (the worker writes
and reads the bytes). Its life::

    snapshot point (a shared prefix's end, a fork's start): the chunk ends there
      -> the step saves the state into fresh blocks (SchedulerOutput.state_saves)
      -> after it, a block-aligned one joins the radix tree (a later hit restores it:
         SchedulerOutput.state_restores); a fork's stays with the request until its children
         took a reference each (they restore it in their first step)

Every holder keeps one pool reference of the blocks: the tree, the request that saved them (a
fork's), a request about to restore them (until its step has run).
"""

from __future__ import annotations

from mlxpa.core.block_pool import BlockPool
from mlxpa.core.radix_cache import RadixCache
from mlxpa.request import Request

StateOp = tuple[Request, list[int]]


class Snapshots:
    """The recurrent snapshots of the requests of one KV cache manager.

    Args:
        pool: The block pool the snapshots' blocks come from.
        tree: The radix tree block-aligned snapshots join (None: prefix caching off).
        num_blocks: Blocks one snapshot takes.
        group: The pool's group index of snapshot blocks (for its per-group counts).
    """

    def __init__(self, pool: BlockPool, tree: RadixCache | None, num_blocks: int,
                 group: int) -> None:
        self.pool, self.tree = pool, tree
        self.num_blocks, self.group = num_blocks, group
        # by request key
        self._points: dict[int, list[int]] = {}
        self._fork_points: dict[int, int] = {}
        self._saves: list[StateOp] = []      # this step's, until taken
        self._restores: list[StateOp] = []
        self._saving: dict[int, tuple[int, list[int]]] = {}  # saved this step, to file
        self._restore_due: dict[int, list[int]] = {}  # before the request's next step
        self._restoring: dict[int, list[int]] = {}    # during it
        self._fork: dict[int, tuple[int, list[int]]] = {}

    # ------------------------------------------------------------------ points

    def add_point(self, req: Request, position: int, fork: bool = False) -> None:
        """Save ``req``'s state at ``position`` when its computation reaches it: for hits of
        later requests (block-aligned, with a tree) or, ``fork``, for the requests forked
        from it there. A point ``req`` has passed is ignored."""
        if position <= req.num_computed_tokens:
            return
        if not fork and (self.tree is None or position % self.pool.block_size):
            return
        points = self._points.setdefault(req.key, [])
        if position not in points:
            points.append(position)
            points.sort()
        if fork:
            self._fork_points[req.key] = position

    def points(self, req: Request) -> list[int]:
        return list(self._points.get(req.key, ()))

    def next_point(self, req: Request, start: int) -> int | None:
        """``req``'s first snapshot point after ``start``."""
        return next((p for p in self._points.get(req.key, ()) if p > start), None)

    def due(self, req: Request, end: int) -> bool:
        """Whether a step of ``req`` that ends at ``end`` must save its state."""
        return end in self._points.get(req.key, ())

    # ------------------------------------------------------------------ a step

    def save(self, req: Request, end: int) -> None:
        """Give ``req``'s step (ending at ``end``) the blocks to save its state into (as
        many must be free)."""
        blocks = self.pool.allocate(self.num_blocks, self.group)
        self._saving[req.key] = (end, blocks)
        self._saves.append((req, blocks))

    def resume_from(self, req: Request, blocks: list[int]) -> None:
        """``req`` resumes from the snapshot in ``blocks`` (a hit's, a fork's; the caller took
        a reference of them for it): restored before its next step's forward."""
        self._restore_due[req.key] = list(blocks)

    def start(self, req: Request) -> None:
        """``req`` is scheduled: its pending restore goes into this step."""
        blocks = self._restore_due.pop(req.key, None)
        if blocks is not None:
            self._restores.append((req, blocks))
            self._restoring[req.key] = blocks

    def take(self) -> tuple[list[StateOp], list[StateOp]]:
        """The ``(saves, restores)`` of the step being built."""
        saves, restores = self._saves, self._restores
        self._saves, self._restores = [], []
        return saves, restores

    def after_step(self, req: Request) -> list[int]:
        """``req``'s step has run (its blocks are in the tree): file the snapshot it saved,
        return the blocks it no longer needs (the snapshot it restored; its fork snapshot
        once its prompt is done: its children took theirs in that step)."""
        freed = self._restoring.pop(req.key, None) or []
        saved = self._saving.pop(req.key, None)
        if saved is not None:
            freed += self._file(req, *saved)
        if req.num_computed_tokens >= req.num_prompt_tokens:
            held = self._fork.pop(req.key, None)
            if held is not None:
                freed += held[1]
        return freed

    def _file(self, req: Request, position: int, blocks: list[int]) -> list[int]:
        """A fork's snapshot stays with ``req``; a block-aligned one joins the tree (which
        takes a reference); returns the blocks kept by neither."""
        points = self._points.get(req.key, [])
        if position in points:
            points.remove(position)
        kept = self._fork_points.get(req.key) == position
        if kept:
            self._fork[req.key] = (position, blocks)
        if (self.tree is not None and position % self.pool.block_size == 0
                and position <= req.num_prompt_tokens):
            if kept:
                self.pool.incref(blocks)
            if self.tree.attach_snapshot(req.prompt_token_ids[:position], blocks,
                                         req.cache_salt):
                return []
            if kept:
                self.pool.free(blocks)
        return [] if kept else blocks

    # ------------------------------------------------------------------ forks

    def fork_blocks(self, parent: Request, position: int) -> list[int] | None:
        """The blocks of ``parent``'s snapshot at ``position``: its fork snapshot, or the one
        the step that just ran saved (filed after the forks)."""
        for held in (self._fork.get(parent.key), self._saving.get(parent.key)):
            if held is not None and held[0] == position:
                return held[1]
        return None

    # ------------------------------------------------------------------ free

    def drop(self, req: Request) -> list[int]:
        """Forget ``req`` (finished, aborted, preempted); returns the blocks it held."""
        self._points.pop(req.key, None)
        self._fork_points.pop(req.key, None)
        held = [b for d in (self._restore_due, self._restoring) for b in d.pop(req.key, ())]
        for d in (self._fork, self._saving):
            entry = d.pop(req.key, None)
            if entry is not None:
                held += entry[1]
        self._saves = [op for op in self._saves if op[0] is not req]
        self._restores = [op for op in self._restores if op[0] is not req]
        return held

    def holders(self) -> list[list[int]]:
        """The block lists the snapshots hold a reference of each (pool invariants)."""
        return [*self._restore_due.values(), *self._restoring.values(),
                *(held[1] for held in (*self._fork.values(), *self._saving.values()))]


__all__ = ["Snapshots"]
