"""GGUF → MLX model folder: dequantized weights, ``config.json`` and a ``tokenizer.json``.

The folder written by :func:`convert_gguf` is what ``mlx_lm.load`` reads. Supported
architectures: ``gemma3`` (mlx-lm ``gemma3_text``) and ``llama`` (mlx-lm ``llama``).

Facts the conversion relies on (DESIGN.md, "Default model"):

- GGUF lists dims innermost-first; reversed, a 2-D weight is ``(out_features, in_features)``,
  ``nn.Linear``'s layout, so nothing is transposed.
- llama.cpp stores Gemma RMSNorm weights as ``1 + w``; mlx-lm adds the 1 itself, so every Gemma
  norm weight gets 1 subtracted. Gemma Q/K are not permuted.
- llama.cpp permutes the rows of ``llama`` Q/K for its interleaved RoPE; mlx-lm uses the
  half-split (NeoX) layout, so the permutation is undone here.
- The tokenizer is rebuilt from the vocabulary: SentencePiece-style BPE whose merges are derived
  from the vocabulary, ranked by token id (checked on Gemma 3: the same 514,906 merges in the same
  order as transformers' GGUF builder). BOS is set in ``tokenizer.json``'s post-processor.

NOTE: metadata is parsed here rather than with ``gguf.GGUFReader``: the reader builds a numpy view
per string, which takes 17 s for Gemma's 262,144-token vocabulary; this parser takes 0.4 s.
Dequantization is ``gguf.quants.dequantize``.
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("gemma3", "llama")

# Gemma 3 turn template (text only): BOS first, a system message folded into the first user turn.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4  # tokenizer.ggml.token_type values


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file, still encoded.

    Attributes:
        name: llama.cpp tensor name, e.g. ``blk.0.attn_q.weight``.
        qtype: ``gguf.GGMLQuantizationType`` value.
        shape: Outermost-first shape (numpy order), e.g. ``(out_features, in_features)``.
        raw: uint8 view of the encoded bytes, shape ``(*shape[:-1], bytes_per_row)``.
    """

    name: str
    qtype: int
    shape: tuple[int, ...]
    raw: np.ndarray

    def dequantize(self) -> np.ndarray:
        """Decodes to float32 with ``gguf.quants.dequantize``; returns an array of ``shape``."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        out = dequantize(self.raw, GGMLQuantizationType(self.qtype))
        return np.asarray(out, dtype=np.float32).reshape(self.shape)


def read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, GGUFTensor]]:
    """Reads a GGUF (v2/v3) file's metadata and memory-maps its tensors.

    Args:
        path: The ``.gguf`` file.

    Returns:
        ``(metadata, tensors)``: metadata values as Python scalars, strings and lists; tensors by
        name, in file order.

    Raises:
        ValueError: If the file is not a GGUF file or uses an unknown value type.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    data = np.memmap(path, mode="r")
    buf = memoryview(data)
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        (value,) = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return value

    def text() -> str:
        nonlocal pos
        size = take("Q")
        pos += size
        return bytes(buf[pos - size : pos]).decode("utf-8", errors="replace")

    def value(kind: int) -> Any:
        nonlocal pos
        if kind == 8:
            return text()
        if kind in _SCALARS:
            return take(_SCALARS[kind])
        if kind != 9:
            raise ValueError(f"{path}: unknown GGUF value type {kind}")
        item_kind, count = take("I"), take("Q")
        if item_kind in _SCALARS:
            dtype = np.dtype("<" + _SCALARS[item_kind])
            items = np.frombuffer(buf, dtype, count, pos)
            pos += items.nbytes
            return items.tolist()
        return [value(item_kind) for _ in range(count)]

    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file (bad magic)")
    pos = 4
    version, n_tensors, n_kv = take("I"), take("Q"), take("Q")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported")
    meta = {}
    for _ in range(n_kv):
        key = text()
        meta[key] = value(take("I"))
    infos = []
    for _ in range(n_tensors):
        name = text()
        dims = [take("Q") for _ in range(take("I"))]
        infos.append((name, tuple(reversed(dims)), take("I"), take("Q")))
    align = meta.get("general.alignment", 32)
    start = (pos + align - 1) // align * align
    tensors = {}
    for name, shape, qtype, offset in infos:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
        row_bytes = shape[-1] // block * block_bytes
        n_bytes = row_bytes * int(np.prod(shape[:-1], dtype=np.int64))
        raw = data[start + offset : start + offset + n_bytes].reshape(*shape[:-1], row_bytes)
        tensors[name] = GGUFTensor(name, qtype, shape, raw)
    return meta, tensors


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: str = "float32") -> Path:
    """Converts a GGUF file into an MLX model folder that ``mlx_lm.load`` reads.

    Writes ``config.json``, ``model.safetensors`` (weights cast to ``dtype``), ``tokenizer.json``,
    ``tokenizer_config.json``, ``special_tokens_map.json`` and ``generation_config.json``.

    Args:
        gguf_path: The ``.gguf`` file.
        out_dir: Folder to write (created if missing; existing files are overwritten).
        dtype: Weight dtype, an ``mlx.core`` dtype name: ``float32``, ``bfloat16`` or ``float16``.

    Returns:
        ``out_dir``.

    Raises:
        ValueError: If the architecture or tokenizer is not supported, naming it and the file.
    """
    import mlx.core as mx

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    meta, tensors = read_gguf(gguf_path)
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} in {gguf_path} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    config = _model_config(meta, tensors, gguf_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {}
    for tensor in tensors.values():
        name, array = _convert_tensor(tensor, config)
        if name is not None:
            weights[name] = mx.array(array).astype(getattr(mx, dtype))
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    del weights
    tokenizer, tokenizer_config = build_tokenizer(meta, gguf_path)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    special = {k: v for k, v in tokenizer_config.items() if k.endswith("_token") and v}
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    for filename, content in [
        ("config.json", config),
        ("generation_config.json", generation),
        ("tokenizer_config.json", tokenizer_config),
        ("special_tokens_map.json", special),
    ]:
        (out_dir / filename).write_text(json.dumps(content, indent=2, ensure_ascii=False))
    return out_dir


def _model_config(meta: dict, tensors: dict[str, GGUFTensor], path: Path) -> dict[str, Any]:
    arch = meta["general.architecture"]

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    hidden, heads = get("embedding_length"), get("attention.head_count")
    head_dim = get("attention.key_length", hidden // heads)
    tokens = meta["tokenizer.ggml.tokens"]
    eos = [meta["tokenizer.ggml.eos_token_id"]]
    for extra in (meta.get("tokenizer.ggml.eot_token_id"), _token_id(tokens, "<end_of_turn>")):
        if extra is not None and extra not in eos:
            eos.append(extra)
    config: dict[str, Any] = {
        "model_type": "gemma3_text" if arch == "gemma3" else "llama",
        "hidden_size": hidden,
        "num_hidden_layers": get("block_count"),
        "intermediate_size": get("feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon"),
        "rope_theta": get("rope.freq_base", 10000.0),
        "max_position_embeddings": get("context_length"),
        "vocab_size": tensors["token_embd.weight"].shape[0],
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos,
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    scaling = get("rope.scaling.type")
    if scaling == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": get("rope.scaling.factor")}
    elif scaling not in (None, "none"):
        raise ValueError(f"RoPE scaling {scaling!r} in {path} is not supported")
    if arch == "gemma3":
        pattern = get("attention.sliding_window_pattern", 6)
        config.update(
            sliding_window=get("attention.sliding_window", 512),
            sliding_window_pattern=pattern if isinstance(pattern, int) else 6,
            rope_local_base_freq=10000.0,
            query_pre_attn_scalar=head_dim,
        )
    else:
        if "rope_freqs.weight" in tensors:
            raise ValueError(f"Llama 3 RoPE frequency factors (rope_freqs) in {path}: not supported")
        if get("rope.dimension_count", head_dim) != head_dim:
            raise ValueError(f"Partial rotary embeddings in {path} are not supported")
        config["attention_bias"] = "blk.0.attn_q.bias" in tensors
        config["mlp_bias"] = "blk.0.ffn_gate.bias" in tensors
    return config


_TOP_LEVEL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _convert_tensor(tensor: GGUFTensor, config: dict) -> tuple[str | None, np.ndarray]:
    """Maps a llama.cpp tensor to its mlx-lm name and values (``None`` name: drop it)."""
    gemma = config["model_type"] == "gemma3_text"
    parts = tensor.name.split(".")
    base, suffix = ".".join(parts[:-1]), parts[-1]
    if base in _TOP_LEVEL:
        name = f"{_TOP_LEVEL[base]}.{suffix}"
    elif parts[0] == "blk" and len(parts) == 4:
        # NOTE: llama's ffn_norm sits before the MLP, in the slot mlx-lm calls post_attention.
        layer = {**_LAYER, "ffn_norm": "pre_feedforward_layernorm" if gemma else
                 "post_attention_layernorm"}.get(parts[2])
        if layer is None:
            raise ValueError(f"Unknown GGUF tensor {tensor.name!r}")
        name = f"model.layers.{parts[1]}.{layer}.{suffix}"
    else:
        raise ValueError(f"Unknown GGUF tensor {tensor.name!r}")
    array = tensor.dequantize()
    if gemma and base.endswith("norm"):
        array = array - 1.0
    elif not gemma and parts[-2] in ("attn_q", "attn_k"):
        heads = config["num_attention_heads" if parts[-2] == "attn_q" else "num_key_value_heads"]
        array = unpermute_qk(array, heads)
    return name, array


def unpermute_qk(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Undoes llama.cpp's ``permute`` of Q/K rows (interleaved RoPE pairs → half split).

    Args:
        weight: ``(n_heads * head_dim, in_features)`` weight or ``(n_heads * head_dim,)`` bias.
        n_heads: Heads in this projection (KV heads for K).

    Returns:
        The array in Hugging Face / mlx-lm row order, same shape and dtype.
    """
    rows = weight.shape[0]
    split = weight.reshape(n_heads, rows // n_heads // 2, 2, *weight.shape[1:])
    return split.swapaxes(1, 2).reshape(weight.shape)


def _token_id(tokens: list[str], token: str) -> int | None:
    try:
        return tokens.index(token)
    except ValueError:
        return None


def build_tokenizer(meta: dict, path: Path) -> tuple[Any, dict[str, Any]]:
    """Builds a ``tokenizers.Tokenizer`` and a ``tokenizer_config`` dict from GGUF metadata.

    Only SentencePiece-style vocabularies (``tokenizer.ggml.model == "llama"``) are supported:
    byte-fallback BPE with merges derived from the vocabulary, ranked by token id. Control tokens
    become special added tokens and user-defined ones plain added tokens; BOS/EOS are added by the
    post-processor as ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` say.

    Raises:
        ValueError: For any other tokenizer model, naming it and the file.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    kind = meta.get("tokenizer.ggml.model")
    if kind != "llama":
        raise ValueError(f"GGUF tokenizer model {kind!r} in {path} is not supported")
    stored, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    # NOTE: tokens of only spaces are stored with real spaces; BPE sees spaces as "▁".
    tokens = ["\u2581" * len(t) if t and set(t) == {" "} else t for t in stored]
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = []
    for index, (token, kind_) in enumerate(zip(tokens, types)):
        if kind_ in (_NORMAL, _USER_DEFINED):
            for cut in range(len(token) - 1, 0, -1):  # longer left piece first, as transformers
                if token[:cut] in vocab and token[cut:] in vocab:
                    merges.append((index, token[:cut], token[cut:]))
    merges.sort(key=lambda m: m[0])  # stable: keeps the longer-left order within one token
    special = {k: meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "unknown")}
    unk = tokens[special["unknown"]] if special["unknown"] is not None else None
    tokenizer = Tokenizer(BPE(vocab, [m[1:] for m in merges], unk_token=unk, fuse_unk=True,
                              byte_fallback=True))
    decode = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        tokenizer.normalizer = normalizers.Sequence(
            [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
        )
        decode.append(decoders.Strip(" ", 1, 0))
    else:
        tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
        tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tokenizer.decoder = decoders.Sequence(decode)
    tokenizer.add_special_tokens(
        [AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types)
         if k == _CONTROL]
    )
    tokenizer.add_tokens(
        [AddedToken(t, normalized=False, special=False) for t, s, k in zip(tokens, stored, types)
         if k == _USER_DEFINED and t == s]
    )
    add_bos = meta.get("tokenizer.ggml.add_bos_token", True) and special["bos"] is not None
    add_eos = meta.get("tokenizer.ggml.add_eos_token", False) and special["eos"] is not None
    bos, eos = (tokens[special[k]] if special[k] is not None else None for k in ("bos", "eos"))
    single = (["$A"] if not add_bos else [bos, "$A"]) + ([eos] if add_eos else [])
    pair = single + [f"{t}:1" for t in single]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=single, pair=[p.replace("$A:1", "$B:1") for p in pair],
        special_tokens=[(tokens[special[k]], special[k]) for k, on in
                        (("bos", add_bos), ("eos", add_eos)) if on],
    )
    pad = meta.get("tokenizer.ggml.padding_token_id")
    arch = meta.get("general.architecture")
    template = meta.get("tokenizer.chat_template")
    if template is None and arch == "gemma3":
        template = GEMMA_CHAT_TEMPLATE
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": unk,
        "pad_token": tokens[pad] if pad is not None else None,
        "add_bos_token": bool(add_bos),
        "add_eos_token": bool(add_eos),
        "clean_up_tokenization_spaces": False,
        "model_max_length": meta.get(f"{arch}.context_length"),
        "chat_template": template,
    }
    return tokenizer, {k: v for k, v in config.items() if v is not None}
