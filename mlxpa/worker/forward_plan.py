"""What one forward pass of a step reads: a group's plan, and the step's reads by kind.

A step runs its requests in padded groups (:mod:`mlxpa.worker.model_runner`). Beside its K/V
writes, a group's pass is read at named positions: the last token of each request that
samples, the positions whose logits score a prompt token, and the last prompt token of a
request with target token ids. :func:`group_reads` finds them,
:func:`~mlxpa.worker.paged_forward.forward` returns the head's inputs there by kind, and
:class:`StepReads` collects them group by group with what each belongs to.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

import mlx.core as mx

from mlxpa.request import Request
from mlxpa.worker.attention import AttentionMetadata
from mlxpa.worker.logprobs import score_columns


class ReadKind(enum.Enum):
    """What a position of a forward pass is read for."""

    SAMPLE = "sample"  # the last scheduled token of a request that samples (and its drafts)
    SCORE = "score"  # a position whose logits score the next prompt token
    TARGET = "target"  # the last prompt token of a request with target token ids


class Positions(NamedTuple):
    """Positions of a padded group: ``(rows[i], cols[i])`` is row and column of the
    ``i``-th."""

    rows: list[int]
    cols: list[int]


@dataclass(frozen=True, slots=True)
class ForwardPlan:
    """One padded group's forward pass: its inputs and the positions read from it.

    Attributes:
        tokens: ``[B, L]`` int32 token ids, right-padded.
        meta: The group's attention metadata
            (:func:`~mlxpa.worker.paged_forward.build_metadata`).
        reads: Per kind, the positions whose head inputs are wanted (a kind may be absent).
        states: Per recurrent-state entry, the group's ``ArraysCache``
            (:class:`~mlxpa.worker.state_store.RecurrentStateStore`), passed to the model in
            that entry's place and updated by it; None without recurrent state.
    """

    tokens: mx.array
    meta: AttentionMetadata
    reads: dict[ReadKind, Positions]
    states: dict | None = None


def group_reads(group: list[int], reqs: list[Request], counts: list[int], starts: list[int],
                sampling: list[bool], drafts: dict[int, list[int]] | None = None,
                ) -> tuple[dict[ReadKind, Positions], dict[ReadKind, list]]:
    """One group's reads and, per kind, what each read position belongs to
    (:attr:`StepReads.owners`).

    Args:
        group: The group's indices in the step's requests (row ``k`` is ``group[k]``).
        reqs: The group's requests.
        counts: Tokens each computes in the step.
        starts: ``num_computed_tokens`` of each.
        sampling: Per request of the step, whether it samples (``SchedulerOutput.sampling``).
        drafts: Per request key, the draft tokens ending its chunk: a request that samples
            is read at its last token before them and at each of them.
    """
    sample = [(k, c) for k, i in enumerate(group) if sampling[i]
              for c in range(counts[k] - 1 - len((drafts or {}).get(reqs[k].key, ())),
                             counts[k])]
    score = [(k, col, token, position) for k, r in enumerate(reqs)
             for col, token, position in score_columns(r, starts[k], counts[k])]
    # targets: read where the chunk ends the prompt (the last prompt token)
    target = [k for k, r in enumerate(reqs)
              if r.target_token_ids and starts[k] + counts[k] == r.num_prompt_tokens]
    reads = {ReadKind.SAMPLE: Positions([k for k, _ in sample], [c for _, c in sample]),
             ReadKind.SCORE: Positions([k for k, *_ in score], [c for _, c, *_ in score]),
             ReadKind.TARGET: Positions(target, [counts[k] - 1 for k in target])}
    owners = {ReadKind.SAMPLE: [group[k] for k, _ in sample],
              ReadKind.SCORE: [(reqs[k], position, token) for k, _, token, position in score],
              ReadKind.TARGET: [reqs[k] for k in target]}
    return reads, owners


class StepReads:
    """A step's reads beside its K/V writes, kind by kind, filled group by group.

    Attributes:
        owners: Per kind, what each read position belongs to, in order: ``SAMPLE``, the
            request's index in ``out.requests`` (a request's positions in a run);
            ``SCORE``, ``(request, position, token id)`` of the scored prompt token;
            ``TARGET``, the request whose targets are read.
    """

    def __init__(self) -> None:
        self.owners: dict[ReadKind, list] = {kind: [] for kind in ReadKind}
        self._features: dict[ReadKind, list[mx.array]] = {kind: [] for kind in ReadKind}

    def add(self, kind: ReadKind, owners: list, features: mx.array) -> None:
        """One group's reads of ``kind``: their owners and ``[N, H]`` head inputs."""
        self.owners[kind].extend(owners)
        self._features[kind].append(features)

    def take(self, kind: ReadKind) -> mx.array | None:
        """Every group's head inputs of ``kind``, concatenated (None when there is none);
        forgotten here, so that the caller holds the only reference."""
        parts = self._features[kind]
        self._features[kind] = []
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else mx.concatenate(parts)
