"""GGUF tokenizer metadata -> ``tokenizers.Tokenizer`` + ``tokenizer_config.json`` dict.

SentencePiece vocabularies become a byte-fallback BPE whose merges are derived from the
vocabulary, ranked by token id (on Gemma 3: the same 514,906 merges, in the same order, as
transformers' GGUF builder); other kinds go to transformers' GGUF tokenizer builder. BOS is set
in ``tokenizer.json``'s post-processor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Gemma 3's turn template (text only): BOS first, a system message folded into the first user turn.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] + '\n\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4  # tokenizer.ggml.token_type values
# fmt: off
_HF_TOKENIZER_FIELDS = {  # tokenizer.ggml.<key> -> transformers' GGUF tokenizer field
    "model": "tokenizer_type", "pre": "pre_tokenizer_type", "tokens": "tokens", "scores": "scores",
    "token_type": "token_type", "merges": "merges", "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id", "unknown_token_id": "unk_token_id",
    "padding_token_id": "pad_token_id", "add_space_prefix": "add_prefix_space",
}
# fmt: on


def build_tokenizer(meta: dict, path: Path) -> tuple[Any, dict[str, Any]]:
    """Builds a ``tokenizers.Tokenizer`` and a ``tokenizer_config.json`` dict from GGUF metadata.

    SentencePiece vocabularies (``tokenizer.ggml.model == "llama"``) are built here; other kinds
    (``gpt2`` byte-level BPE) go to transformers' GGUF tokenizer builder. Control tokens become
    special added tokens, user-defined ones plain added tokens; the post-processor adds BOS/EOS
    as ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` say (BOS by default).

    Raises:
        ValueError: If the tokenizer model is not supported, naming it and the file.
    """
    from tokenizers import processors

    tokens = meta["tokenizer.ggml.tokens"]
    if meta.get("tokenizer.ggml.model") == "llama":
        tokenizer = _sentencepiece_bpe(meta)
    else:
        tokenizer = _transformers_tokenizer(meta, path)
    ids = {
        k: meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "unknown", "padding")
    }
    name = {k: tokens[i] if i is not None else None for k, i in ids.items()}
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", True)) and ids["bos"] is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and ids["eos"] is not None
    head, tail = [name["bos"]] * add_bos, [name["eos"]] * add_eos
    tokenizer.post_processor = processors.TemplateProcessing(
        single=[*head, "$A", *tail],
        pair=[*head, "$A", *tail] + [f"{t}:1" for t in [*head, "$B", *tail]],
        special_tokens=[(name[k], ids[k]) for k in ("bos",) * add_bos + ("eos",) * add_eos],
    )
    arch = meta["general.architecture"]
    chat_template = meta.get("tokenizer.chat_template")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": name["bos"],
        "eos_token": name["eos"],
        "unk_token": name["unknown"],
        "pad_token": name["padding"],
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": meta.get(f"{arch}.context_length"),
        "chat_template": chat_template or (GEMMA_CHAT_TEMPLATE if arch == "gemma3" else None),
    }
    return tokenizer, {k: v for k, v in config.items() if v is not None}


def _sentencepiece_bpe(meta: dict) -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    stored, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    # NOTE: tokens of only spaces are stored with real spaces; the BPE model sees "▁" for " ".
    tokens = ["\u2581" * len(t) if t and set(t) == {" "} else t for t in stored]
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = [  # by token id, then the longer left piece first (as transformers)
        (token[:cut], token[cut:])
        for token, kind in zip(tokens, types, strict=True)
        if kind in (_NORMAL, _USER_DEFINED)
        for cut in range(len(token) - 1, 0, -1)
        if token[:cut] in vocab and token[cut:] in vocab
    ]
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None else None
    tokenizer = Tokenizer(BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    decode = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        prepend = normalizers.Prepend("\u2581")
        tokenizer.normalizer = normalizers.Sequence([prepend, normalizers.Replace(" ", "\u2581")])
        decode.append(decoders.Strip(" ", 1, 0))
    else:
        tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
        tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tokenizer.decoder = decoders.Sequence(decode)
    triples = list(zip(tokens, stored, types, strict=True))
    control = [
        AddedToken(t, normalized=False, special=True) for t, _, k in triples if k == _CONTROL
    ]
    tokenizer.add_special_tokens(control)
    tokenizer.add_tokens(
        [AddedToken(t, normalized=False) for t, s, k in triples if k == _USER_DEFINED and t == s]
    )
    return tokenizer


def _transformers_tokenizer(meta: dict, path: Path) -> Any:
    try:  # transformers >= 5
        from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
    except ImportError:  # transformers 4.x
        from transformers.integrations.ggml import convert_gguf_tokenizer
    fields = {
        new: meta[f"tokenizer.ggml.{old}"]
        for old, new in _HF_TOKENIZER_FIELDS.items()
        if f"tokenizer.ggml.{old}" in meta
    }
    try:
        return convert_gguf_tokenizer(meta["general.architecture"], fields)[0]
    except (KeyError, ValueError) as err:
        kind = meta.get("tokenizer.ggml.model")
        raise ValueError(f"GGUF tokenizer model {kind!r} in {path} is not supported") from err
