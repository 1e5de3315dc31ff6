"""Streaming outputs (``RequestOutputKind.DELTA``): the pieces a request gets after each step
join to exactly what the same request gets as one final output (the oracle: the same engine
with ``FINAL_ONLY``, and for the detokenizer alone its own ``finalize`` and Python's cut at the
first stop string), with stop strings that span tokens, multi-byte characters split over
byte tokens (mlx-lm's BPE detokenizer holds incomplete UTF-8 back), ``n > 1``, log-probabilities
and stop strings kept in the output."""

from __future__ import annotations

import pytest
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from mlxpa.config import EngineConfig
from mlxpa.engine import LLMEngine
from mlxpa.engine.detokenizer import IncrementalDetokenizer
from mlxpa.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams
from tests.tiny_models import byte_tokenizer, tiny_llama

DELTA, FINAL = RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY
TEXT = "héllo wörld, 日本語 and more: 日本! éé end"


def byte_bpe() -> TokenizerWrapper:
    """GPT-2 style byte-level BPE with no merges: one token per byte (ids 3..258), so every
    non-ASCII character is split over two to four tokens."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, **{c: i + 3 for i, c in enumerate(alphabet)}}
    tok = Tokenizer(models.BPE(vocab, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>")
    return TokenizerWrapper(fast, BPEStreamingDetokenizer, eos_token_ids={1})


BPE = byte_bpe()


@pytest.mark.parametrize(("stop", "include", "min_tokens"), [
    ((), False, 0), (("日本",), False, 0), (("日本",), True, 0), (("ö", "語 a"), False, 0),
    ((": 日",), False, 0), (("é",), False, 20), (("nothing",), False, 0)])
def test_taken_pieces_join_to_the_final_text(stop, include, min_tokens):
    ids = BPE.encode(TEXT, add_special_tokens=False)
    assert len(ids) > len(TEXT)  # multi-byte characters span tokens
    detok = IncrementalDetokenizer(BPE, stop, include, min_tokens)
    pieces = []
    for token in ids:
        stopped = detok.add_token(token)
        if stopped:
            break
        pieces.append(detok.take_text())
        assert "\ufffd" not in pieces[-1]  # never half a character
    final = detok.finalize()
    assert "".join(pieces) + detok.rest(final) == final
    if min_tokens == 0:  # Python's own cut at the first stop string
        at = min((TEXT.find(s) for s in stop if s in TEXT), default=None)
        cut = TEXT if at is None else TEXT[:at + (len(stop[0]) if include else 0)]
        assert final == cut
    held = max((len(s) for s in stop), default=1) - 1
    if stop and not include and not stopped:
        assert len("".join(pieces)) <= len(TEXT) - held


def _run(tok, vocab, kind, params, prompt="hello there, "):
    """Every output of one request (in step order) on a fresh engine."""
    eng = LLMEngine(EngineConfig(block_size=4, num_blocks=400, max_num_seqs=8,
                                 max_num_batched_tokens=64), tiny_llama(vocab=vocab), tok)
    outs: dict[int, list] = {}
    assert eng.add_request("r", tok.encode(prompt), params.__class__(
        **{**_fields(params), "output_kind": kind})) is None
    while eng.has_unfinished_requests():
        for o in eng.step():
            outs.setdefault(o.sample_index, []).append(o)
    return outs


def _fields(params: SamplingParams) -> dict:
    return {f: getattr(params, f) for f in params.__dataclass_fields__}


@pytest.mark.parametrize("tok_name", ["byte-bpe", "chars"])
@pytest.mark.parametrize("include", [False, True])
def test_deltas_join_to_the_final_only_output(tok_name, include):
    if tok_name == "byte-bpe":  # a regex keeps the bytes whole characters: é, 日, 本
        tok, vocab, stop = BPE, 259, ("本日", "éé")
        so = StructuredOutputsParams(regex="(é|日本|本| x)+")
    else:
        tok, vocab, so, stop = byte_tokenizer(eos_id=-1), 256, None, ("Ċä", "xģ", "q")
    # seed 6: with both tokenizers a stop string ends some samples and not others
    params = SamplingParams(max_tokens=40, n=3, temperature=1.0, seed=6, stop=stop,
                            include_stop_str_in_output=include, logprobs=2,
                            structured_outputs=so)
    final, deltas = _run(tok, vocab, FINAL, params), _run(tok, vocab, DELTA, params)
    assert sorted(final) == sorted(deltas) == [0, 1, 2]
    reasons = set()
    for i, (whole,) in final.items():
        pieces = deltas[i]
        assert [p.finished for p in pieces] == [False] * (len(pieces) - 1) + [True]
        assert all(p.finish_reason is None for p in pieces[:-1])
        assert len(pieces) == len(whole.token_ids)  # one per step that gave a token
        assert "".join(p.text for p in pieces) == whole.text
        assert sum((p.token_ids for p in pieces), []) == whole.token_ids
        assert sum((p.logprobs for p in pieces), []) == whole.logprobs
        last = pieces[-1]
        assert (last.finish_reason, last.stop_reason, last.ttft_s is not None) == (
            whole.finish_reason, whole.stop_reason, True)
        reasons.add(whole.stop_reason in stop)
    assert reasons == {True, False}  # a stop string ended one sample, not every one
    if tok_name == "byte-bpe":
        texts = "".join(o.text for (o,) in final.values())
        assert {"日", "本"} <= set(texts) and "\ufffd" not in texts
