"""Draft-free speculative decoding: proposers that guess a running request's next tokens from
text it (or an earlier finished request) already holds, so one forward verifies several
tokens. Pure Python: no mlx. :func:`make_proposer` builds the one a config names."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlxpa.spec_decode.ngram import NgramProposer
from mlxpa.spec_decode.proposer import Proposer
from mlxpa.spec_decode.suffix import SuffixDecodingProposer

if TYPE_CHECKING:
    from mlxpa.config import SpeculativeConfig

__all__ = ["NgramProposer", "Proposer", "SuffixDecodingProposer", "make_proposer"]


def make_proposer(config: SpeculativeConfig) -> Proposer:
    """The proposer of ``config.method`` (``ngram`` or ``suffix``), set from its fields.

    Raises:
        ValueError: An unknown method (a validated config has none).
    """
    if config.method == "ngram":
        return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    if config.method == "suffix":
        return SuffixDecodingProposer(
            config.suffix_decoding_max_tree_depth, config.suffix_decoding_max_cached_requests,
            config.suffix_decoding_max_spec_factor, config.suffix_decoding_min_token_prob)
    raise ValueError(f"unknown speculative method {config.method!r}")
