"""The llguidance tokenizer: built in a background thread once per tokenizer (the build
overlaps the model load), equal to ``llguidance.hf.from_tokenizer``'s (the oracle) token by
token and in the masks it gives, a failed build raised where it is awaited."""

from __future__ import annotations

import threading

import llguidance
import llguidance.hf
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from mlxpa.structured import matchers
from mlxpa.structured.matchers import start_ll_tokenizer
from tests.tiny_models import byte_tokenizer

VOCAB = 259


def byte_level_bpe() -> PreTrainedTokenizerFast:
    """A GPT-2-style byte-level BPE (a decoder llguidance reads): the 256 byte symbols, two
    merges, EOS 258."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({"ab": 256, "12": 257, "<eos>": 258})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b"), ("1", "2")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def test_background_build_matches_llguidance_and_is_cached():
    hf = byte_level_bpe()
    future = start_ll_tokenizer(hf, VOCAB, [258])
    ours = start_ll_tokenizer(hf, VOCAB, [258]).result()
    assert future.done() and ours is future.result()
    assert start_ll_tokenizer(hf, VOCAB, [258]) is future  # once per tokenizer
    ref = llguidance.hf.from_tokenizer(hf, n_vocab=VOCAB, eos_token=[258])
    assert ours.decode_bytes([256, 257]) == b"ab12" and ours.is_special_token(258)
    for t in range(VOCAB):
        assert ours.decode_bytes([t]) == ref.decode_bytes([t]), t
        assert ours.is_special_token(t) == ref.is_special_token(t), t
    grammar = llguidance.LLMatcher.grammar_from_regex("ab[0-9]+")
    a, b = llguidance.LLMatcher(ours, grammar), llguidance.LLMatcher(ref, grammar)
    for tok in hf.encode("ab12", add_special_tokens=False):  # [256, 257]
        assert a.compute_bitmask() == b.compute_bitmask()
        assert a.consume_token(tok) and b.consume_token(tok)
    assert a.compute_bitmask() == b.compute_bitmask()


def test_build_runs_in_a_thread_and_its_error_reaches_the_waiter(monkeypatch):
    threads = []

    def fail(*_args):
        threads.append(threading.current_thread())
        raise ValueError("no vocabulary")

    monkeypatch.setattr(matchers, "_build_ll_tokenizer", fail)
    hf = byte_tokenizer()._tokenizer  # a new tokenizer object: not cached
    with pytest.raises(ValueError, match="no vocabulary"):
        start_ll_tokenizer(hf, VOCAB, [1]).result()
    assert threads and threads[0] is not threading.main_thread()
