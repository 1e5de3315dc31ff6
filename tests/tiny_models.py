"""Tiny random-weight mlx-lm models and a character-level tokenizer, built offline."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
from mlx_lm.models import gemma3_text, llama
from mlx_lm.tokenizer_utils import TokenizerWrapper
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

VOCAB = 256


def tiny_llama(seed: int = 0, vocab: int = VOCAB, tie: bool = False, hidden: int = 64):
    mx.random.seed(seed)
    args = llama.ModelArgs(model_type="llama", hidden_size=hidden, num_hidden_layers=2,
                           intermediate_size=2 * hidden, num_attention_heads=4, rms_norm_eps=1e-5,
                           vocab_size=vocab, num_key_value_heads=2,
                           max_position_embeddings=4096, tie_word_embeddings=tie)
    model = llama.Model(args)
    _scale_weights(model)
    return model


def tiny_gemma3(seed: int = 0, vocab: int = VOCAB, sliding_window: int = 8,
                head_dim: int = 32, num_layers: int = 3):
    mx.random.seed(seed)
    args = gemma3_text.ModelArgs(model_type="gemma3_text", hidden_size=64,
                                 num_hidden_layers=num_layers,
                                 intermediate_size=128, num_attention_heads=4,
                                 head_dim=head_dim, num_key_value_heads=1, vocab_size=vocab,
                                 sliding_window=sliding_window, sliding_window_pattern=3,
                                 query_pre_attn_scalar=head_dim, max_position_embeddings=4096)
    model = gemma3_text.Model(args)
    model.sanitize({})  # tie embeddings as the real checkpoint does
    _scale_weights(model)
    return model


def _scale_weights(model) -> None:
    """Random weights scaled so greedy tokens vary from step to step, as a trained model's
    do (default init makes a tiny model repeat one token, which would hide bugs)."""
    from mlx.utils import tree_flatten, tree_unflatten

    params = []
    for k, v in tree_flatten(model.parameters()):
        if k.endswith("embed_tokens.weight"):
            v = mx.random.normal(v.shape) * 0.02
        elif v.ndim == 2:
            v = mx.random.normal(v.shape) / v.shape[1] ** 0.5
        params.append((k, v))
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())


def byte_tokenizer(eos_id: int = 1) -> TokenizerWrapper:
    """A tokenizer whose ids 3..255 are single characters (BOS 2, EOS ``eos_id``)."""
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2}
    chars = ["\n"] + [chr(c) for c in range(0x20, 0x7F)] + [chr(c) for c in range(0xA1, 0x200)]
    for i in range(3, VOCAB):
        vocab[chars[i - 3]] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>")
    return TokenizerWrapper(fast, eos_token_ids={eos_id})


# Raises on any role but user/assistant/system, as real chat templates do.
STRICT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] not in ['user', 'assistant', 'system'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:")


def save_tokenizer_only(folder, chat_template: str | None = STRICT_TEMPLATE) -> str:
    """A tiny model folder without its weights: anything that loads the model fails (what
    runs before the load is checked with it)."""
    import os

    folder = save_tiny_model(folder, chat_template=chat_template)
    os.remove(os.path.join(folder, "model.safetensors"))
    return folder


def save_tiny_model(folder, kind: str = "llama", chat_template: str | None = None,
                    **model_args) -> str:
    """Write a tiny random model and the byte tokenizer as an MLX model folder
    (what ``mlx_lm.load`` reads), for CLI tests (``model_args``: to :func:`tiny_llama` or
    :func:`tiny_gemma3`)."""
    import json
    from pathlib import Path

    from mlx.utils import tree_flatten

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = tiny_llama(**model_args) if kind == "llama" else tiny_gemma3(**model_args)
    config = {k: v for k, v in vars(model.args).items() if v is not None}
    config["eos_token_id"] = 1
    (folder / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    tok = byte_tokenizer()._tokenizer
    if chat_template:
        tok.chat_template = chat_template
    tok.save_pretrained(str(folder))
    return str(folder)


def float64_log_softmax(model, ids: list[int]) -> np.ndarray:
    """``[len(ids), V]`` float64 log-softmax of mlx-lm's own forward pass over ``ids`` (no
    cache): the oracle of the log-probability tests."""
    logits = np.array(model(mx.array(ids)[None])[0].astype(mx.float32), dtype=np.float64)
    top = logits.max(axis=-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))


def teacher_forced(model, tok, prompt: list[int], labels) -> list[float]:
    """Each label's float64 log-probability after ``prompt`` (mlx-lm's forward over
    prompt + label, no cache; the label tokenized without special tokens)."""
    scores = []
    for label in labels:
        ids = tok.encode(label, add_special_tokens=False)
        ref = float64_log_softmax(model, prompt + ids)
        scores.append(math.fsum(ref[len(prompt) - 1 + j][t] for j, t in enumerate(ids)))
    return scores
