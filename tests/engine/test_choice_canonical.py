"""Choice rows are written in the labels' canonical tokenizations (tiny random model and a
tokenizer with merged tokens, so " red" can be spelt as one token or as " " + "r" + ...):
the output tokens are exactly the tokenizer's encoding of the chosen label, and a greedy
row writes the argmax of its ``choice_logprobs``."""

from __future__ import annotations

import math

from mlx_lm.tokenizer_utils import TokenizerWrapper
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.request import EngineRequest
from mlxpa.sampling_params import SamplingParams, StructuredOutput
from tests.tiny_models import VOCAB, byte_tokenizer, tiny_llama

MERGED = [" r", " re", " red", " g", " gr", " gre", " gree", " green"]
PROMPTS = ["hello world, this is a test", "a", "Pick a colour:", "0123456789abcde",
           "short prompt", "The quick brown fox", "zz", "colour? "]


def merged_tokenizer() -> TokenizerWrapper:
    """The byte tokenizer's characters with their last ids given to the merged tokens of
    " red" and " green" (BPE merges), so both labels also have non-canonical spellings."""
    vocab = dict(byte_tokenizer()._tokenizer.get_vocab())
    spare = sorted(vocab.values())[-len(MERGED):]
    vocab = {t: i for t, i in vocab.items() if i not in spare}
    vocab.update(zip(MERGED, spare))
    merges = [(m[:-1], m[-1]) for m in MERGED]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<pad>"))
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>")
    return TokenizerWrapper(fast, eos_token_ids={1})


def test_choice_tokens_are_canonical_and_greedy_is_the_argmax():
    tok = merged_tokenizer()
    canonical = {c: tok.encode(c, add_special_tokens=False) for c in (" red", " green")}
    assert canonical == {" red": [VOCAB - 6], " green": [VOCAB - 1]}
    assert tok.encode(" r", add_special_tokens=False) == [VOCAB - 8]  # other spellings exist
    choice = StructuredOutput.make("choice", [" red", " green"])
    greedy = SamplingParams(max_tokens=8, structured_outputs=choice)
    sampled = SamplingParams(max_tokens=8, structured_outputs=choice, temperature=1.0, n=3)
    items = [EngineRequest(f"{kind}/{i}", tok.encode(p), params)
             for i, p in enumerate(PROMPTS)
             for kind, params in (("greedy", greedy), ("sampled", sampled))]
    eng = LLMEngine(EngineConfig(block_size=8, num_blocks=128), tiny_llama(), tok)
    outs = list(eng.generate(items))
    assert len(outs) == len(PROMPTS) * 4
    for o in outs:
        assert o.text in canonical and o.token_ids == canonical[o.text], (o.text, o.token_ids)
        if o.request_id.startswith("greedy/"):
            scores = o.choice_logprobs
            assert o.text == max(scores, key=scores.get)
            assert sum(map(math.exp, scores.values())) <= 1 + 1e-6  # disjoint events
