"""Draft tokens for each request's next step (speculative decoding), proposed in the runner
after sampling as vLLM's model runner does: the proposer's guess from the request's own
tokens and earlier finished outputs (:mod:`mlxpa.spec_decode`), cut where the request's
grammar refuses it, or the tokens its grammar forces (llguidance's fast-forward tokens)."""

from __future__ import annotations

from collections.abc import Sequence

from mlxpa.request import Request, RequestStatus
from mlxpa.spec_decode.proposer import Proposer
from mlxpa.structured.matchers import Grammars


class TokenView(Sequence):
    """A request's prompt, output and just-emitted tokens as one sequence, without
    concatenating the context every step."""

    def __init__(self, *parts: list[int]) -> None:
        self._parts = parts
        self._len = sum(map(len, parts))

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            out: list[int] = []
            for part in self._parts:
                if stop <= 0:
                    break
                if start < len(part):
                    out.extend(part[max(start, 0):stop])
                start, stop = start - len(part), stop - len(part)
            return out
        i = index + self._len if index < 0 else index
        if not 0 <= i < self._len:
            raise IndexError(index)
        for part in self._parts:
            if i < len(part):
                return part[i]
            i -= len(part)
        raise IndexError(index)


class Drafter:
    """Proposes the next step's drafts of the requests that sampled.

    Args:
        proposer: The method (:func:`mlxpa.spec_decode.make_proposer`).
        num_speculative_tokens: Most drafts per request (k).
        grammars: The constrained requests' matchers, or None.
    """

    def __init__(self, proposer: Proposer, num_speculative_tokens: int,
                 grammars: Grammars | None) -> None:
        self.proposer = proposer
        self.k = num_speculative_tokens
        self.grammars = grammars
        self._known: set[int] = set()

    def propose(self, reqs: list[Request], emitted: list[list[int]]) -> dict[int, list[int]]:
        """Per request key, the drafts to follow ``emitted`` (its tokens of this step, not
        yet in its ``output_token_ids``): at most k, and no more than its ``max_tokens``
        leaves room for after one further token."""
        drafts = {}
        for req, new in zip(reqs, emitted):
            room = min(self.k, req.max_tokens - req.num_output_tokens - len(new) - 1)
            if room <= 0:
                continue
            if req.key not in self._known:
                self.proposer.add_request(req.key, req.prompt_token_ids)
                self._known.add(req.key)
            d = self.proposer.propose(
                req.key, TokenView(req.prompt_token_ids, req.output_token_ids, new), room)
            if self.grammars is not None:
                d = self.grammars.draft_prefix(req, req.num_output_tokens + len(new), d)[:room]
            if d:
                drafts[req.key] = list(d)
        return drafts

    def finish(self, reqs: list[Request]) -> None:
        """Forget finished requests; a completed unsalted one's output may serve later drafts
        (a salted one's never does: how fast another request's drafts are accepted would
        tell what it wrote, across ``cache_salt`` namespaces)."""
        for req in reqs:
            if req.key in self._known:
                self._known.discard(req.key)
                done = req.status != RequestStatus.FINISHED_ABORTED and req.cache_salt is None
                self.proposer.finish_request(req.key, req.output_token_ids if done else None)
