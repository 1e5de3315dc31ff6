"""The proposer protocol every draft-free method follows, keyed by ``Request.key``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Proposer(Protocol):
    """Guesses the next tokens of running requests.

    A request is added once (its prompt), asked for drafts after each step that gave it
    tokens (its whole token list so far, which only grows, so a proposer may index only the
    tail it has not seen), and finished once: with its output when it completed (a method
    with a shared store may keep it for later requests), or with None when it was aborted
    or failed (nothing of it is kept). A request's drafts come only from its own tokens and
    from outputs of requests already finished, never from another running request.
    """

    def add_request(self, key: int, prompt_token_ids: Sequence[int]) -> None:
        """Start tracking request ``key``."""

    def propose(self, key: int, token_ids: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` draft tokens to follow ``token_ids`` (prompt + output so far)."""

    def finish_request(self, key: int, output_token_ids: Sequence[int] | None) -> None:
        """Stop tracking ``key``; ``output_token_ids`` is the completed output, or None."""
