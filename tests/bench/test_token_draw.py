"""Synthetic prompts every system reads as the same ids: no special, added or byte-fallback ids
drawn, and each prompt (alone, after its shared prefix, and through a chat template) encodes
back to the drawn ids, checked with the tokenizer itself; on the default model's Gemma
tokenizer too, where mlx-lm's count of a chat prompt (``apply_chat_template``) is what mlxpa
counts."""

from __future__ import annotations

import numpy as np
import pytest

from mlxpa.bench.serve_workloads import synthetic_requests
from mlxpa.bench.token_draw import TokenDraw
from mlxpa.bench.workloads import random_workload, shared_prefix_workload
from tests.tiny_models import STRICT_TEMPLATE, byte_tokenizer

ADDED = [f"<unused{i}>" for i in range(40)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The byte tokenizer with Gemma-like added tokens that are not special, and a chat
    template."""
    from mlxpa.loader.models import load_tokenizer_of

    hf = byte_tokenizer()._tokenizer
    hf.add_tokens(ADDED)
    hf.chat_template = STRICT_TEMPLATE
    folder = tmp_path_factory.mktemp("tok")
    hf.save_pretrained(str(folder))
    (folder / "config.json").write_text('{"model_type": "llama"}')
    return load_tokenizer_of(str(folder))


def _encode(tok, ids: list[int]) -> list[int]:
    return tok.encode(tok.decode(ids), add_special_tokens=False)


def test_the_pool_leaves_out_special_and_added_tokens(tokenizer):
    added = {tokenizer.convert_tokens_to_ids(t) for t in ADDED}
    draw = TokenDraw(tokenizer)
    assert added <= draw.excluded and set(tokenizer.all_special_ids) <= draw.excluded
    assert not set(draw.pool.tolist()) & (added | set(tokenizer.all_special_ids))
    # without the exclusion such ids are drawn: the pool is most of a small vocabulary
    assert len(added) / len(tokenizer.vocab) > 0.1


def test_random_and_shared_prefix_prompts_round_trip(tokenizer):
    bos = tokenizer.bos_token_id
    excluded = TokenDraw(tokenizer).excluded - {bos}
    rnd = random_workload(tokenizer, num_prompts=20, input_len=30, output_len=2, seed=3)
    sp = shared_prefix_workload(tokenizer, num_groups=2, prompts_per_group=5,
                                system_prompt_len=40, question_len=12, seed=3)
    for p in rnd.prompts + sp.prompts:
        assert p[0] == bos and not excluded & set(p)
        assert _encode(tokenizer, p[1:]) == p[1:]
        text = tokenizer.decode(p[1:])
        assert text == text.strip()
    assert [len(p) for p in sp.prompts] == [52] * 10
    for p in sp.prompts:
        system, question = p[1:40], p[40:]
        assert _encode(tokenizer, system) == system
        assert _encode(tokenizer, question) == question


def test_draws_are_reproducible_fixed_points(tokenizer):
    """A drawn run that would merge or split on re-encoding is not kept: every draw is a
    fixed point, its text free of spaces at either end, and the draw is reproducible."""
    draw = TokenDraw(tokenizer)
    a = [draw.draw(np.random.default_rng(7), 25) for _ in range(2)]
    assert a[0] == a[1] and len(a[0]) == 25
    for seed in range(20):
        ids = draw.draw(np.random.default_rng(seed), 16, prefix=a[0])
        assert draw.round_trips(ids, a[0]) and _encode(tokenizer, a[0] + ids) == a[0] + ids


def test_serve_requests_hold_the_drawn_ids(tokenizer):
    for endpoint in ("chat", "completions"):
        wl = synthetic_requests("shared-prefix", tokenizer, endpoint, num_groups=1,
                                prompts_per_group=6, system_prompt_len=30, question_len=8,
                                seed=1)
        assert wl.params["not_round_trip"] == 0
        for r in wl.requests:
            if endpoint == "chat":
                read = tokenizer.apply_chat_template(r.row["messages"],
                                                     add_generation_prompt=True)
            else:
                read = tokenizer.encode(r.row["prompt"])
            assert r.prompt_len == len(read)


@pytest.mark.real_model
def test_gemma_prompts_are_read_alike_by_mlx_lm_and_mlxpa(default_model_dir):
    """The sitting of the issue: Gemma's added tokens (``<unused4369>``) made mlx-lm read 643
    tokens a request where mlxpa read 567. Now mlx-lm's count (the chat template with added
    tokens parsed) equals mlxpa's (the request's ``prompt_len``), on both endpoints."""
    from mlxpa.loader.models import load_tokenizer_of

    tok = load_tokenizer_of(str(default_model_dir))
    added = set(tok.get_added_vocab().values())
    for endpoint in ("chat", "completions"):
        wl = synthetic_requests("shared-prefix", tok, endpoint, num_groups=1,
                                prompts_per_group=12, system_prompt_len=512,
                                question_len=32, seed=0)
        assert wl.params["not_round_trip"] == 0
        for r in wl.requests:
            if endpoint == "chat":
                read = tok.apply_chat_template(r.row["messages"], add_generation_prompt=True)
            else:
                read = tok.encode(r.row["prompt"])
            assert len(read) == r.prompt_len
            texts = ([m["content"] for m in r.row["messages"]] if endpoint == "chat"
                     else [r.row["prompt"]])
            for text in texts:
                assert not added & set(tok.encode(text, add_special_tokens=False))


def test_byte_level_pieces_of_part_of_a_character_are_not_drawn():
    """A GPT-2 byte-level BPE whose vocabulary has the bytes and two-byte heads of CJK
    characters as well as the characters (as benchmarks/hybrid_model.py's): the partial
    pieces are excluded (their bytes do not decode alone), and drawn characters round-trip."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from mlxpa.bench.token_draw import byte_level_alphabet

    bc = byte_level_alphabet()
    vocab = {bc[b]: b for b in range(256)}
    merges = []
    for cp in range(0x4E00, 0x4E00 + 300):
        b1, b2, b3 = (bc[b] for b in chr(cp).encode())
        if b1 + b2 not in vocab:
            vocab[b1 + b2] = len(vocab)
            merges.append((b1, b2))
        vocab[b1 + b2 + b3] = len(vocab)
        merges.append((b1 + b2, b3))
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    draw = TokenDraw(fast)
    whole = {i for piece, i in vocab.items() if len(piece) == 3}
    partial = {i for piece, i in vocab.items() if len(piece) == 2} | set(range(128, 256))
    assert partial <= draw.excluded and not whole & draw.excluded
    ids = draw.draw(np.random.default_rng(0), 64)
    assert fast.encode(fast.decode(ids), add_special_tokens=False) == ids
