"""Draft-free speculative decoding: proposers that guess a running request's next tokens from
text it (or an earlier finished request) already holds, so one forward verifies several
tokens. Pure Python: no mlx."""

from mlxpa.config import SpeculativeConfig
from mlxpa.spec_decode.proposer import Proposer


def make_proposer(config: SpeculativeConfig) -> Proposer:
    """The proposer of ``config.method``, with its settings."""
    if config.method == "ngram":
        from mlxpa.spec_decode.ngram import NgramProposer

        return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    from mlxpa.spec_decode.suffix import SuffixDecodingProposer

    return SuffixDecodingProposer(config.suffix_decoding_max_tree_depth,
                                  config.suffix_decoding_max_cached_requests,
                                  config.suffix_decoding_max_spec_factor,
                                  config.suffix_decoding_min_token_prob)
