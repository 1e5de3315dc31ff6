"""GGUF → MLX model folder: dequantized weights, ``config.json`` and a ``tokenizer.json``.

:func:`convert_gguf` writes a folder that ``mlx_lm.load`` reads. Architectures: ``gemma3``
(mlx-lm ``gemma3_text``) and ``llama`` (mlx-lm ``llama``). Facts it relies on:

- GGUF lists dims innermost-first; reversed, a 2-D weight is ``(out_features, in_features)``,
  ``nn.Linear``'s layout, so nothing is transposed.
- llama.cpp stores Gemma RMSNorm weights as ``1 + w`` and mlx-lm adds the 1 itself: 1 is
  subtracted from every Gemma norm weight. Gemma Q/K are not permuted.
- llama.cpp permutes ``llama`` Q/K rows for its interleaved RoPE; mlx-lm rotates half-split
  (NeoX) pairs, so the permutation is undone.
- The tokenizer is built from the GGUF metadata by :mod:`mlxpa.loader.gguf_tokenizer`.

NOTE: metadata is parsed here, not with ``gguf.GGUFReader``: the reader builds numpy views per
string, 17 s for Gemma's 262,144-token vocabulary against 0.4 s here. ``gguf.quants.dequantize``
decodes the tensors.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from mlxpa.loader.gguf_tokenizer import build_tokenizer

SUPPORTED_ARCHITECTURES = ("gemma3", "llama")

# GGUF value type -> struct format (8 is a string, 9 an array).
_SCALARS = dict(zip((0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12), "BbHhIif?Qqd", strict=True))
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")
_TOP_LEVEL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# fmt: off
_LAYER = {  # blk.N.<key> -> model.layers.N.<value> (ffn_norm depends on the architecture)
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
# fmt: on


class GGUFTensor(NamedTuple):
    """An encoded GGUF tensor: llama.cpp ``name``, ``gguf.GGMLQuantizationType`` value ``qtype``,
    outermost-first ``shape`` and ``raw`` bytes (uint8 memmap, ``(*shape[:-1], row_bytes)``)."""

    name: str
    qtype: int
    shape: tuple[int, ...]
    raw: np.ndarray

    def dequantize(self) -> np.ndarray:
        """Decodes with ``gguf.quants.dequantize``; returns float32 of shape ``shape``."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        out = dequantize(self.raw, GGMLQuantizationType(self.qtype))
        return np.asarray(out, dtype=np.float32).reshape(self.shape)


def read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, GGUFTensor]]:
    """Reads a GGUF v2/v3 file's metadata and memory-maps its tensors.

    Returns:
        ``(metadata, tensors)``: metadata values as Python scalars, strings and lists (float32
        scalars as their shortest decimal); tensors by name, in file order.

    Raises:
        ValueError: If ``path`` is not a GGUF file or uses an unknown value type.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    data = np.memmap(path, mode="r")
    buf, pos = memoryview(data), 4

    def take(fmt: str) -> Any:
        nonlocal pos
        (value,) = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return value

    def value(kind: int) -> Any:
        nonlocal pos
        if kind == 8:
            size = take("Q")
            pos += size
            return bytes(buf[pos - size : pos]).decode("utf-8", errors="replace")
        if kind == 6:  # float32: 1e-06 rather than 9.999999974752427e-07
            return float(str(np.float32(take("f"))))
        if kind in _SCALARS:
            return take(_SCALARS[kind])
        if kind != 9:
            raise ValueError(f"{path}: unknown GGUF value type {kind}")
        item_kind, count = take("I"), take("Q")
        if item_kind not in _SCALARS:
            return [value(item_kind) for _ in range(count)]
        items = np.frombuffer(buf, np.dtype("<" + _SCALARS[item_kind]), count, pos)
        pos += items.nbytes
        return items.tolist()

    if bytes(buf[:4]) != b"GGUF" or take("I") not in (2, 3):
        raise ValueError(f"{path} is not a GGUF v2/v3 file")
    n_tensors, n_kv = take("Q"), take("Q")
    meta = {value(8): value(take("I")) for _ in range(n_kv)}
    infos = []
    for _ in range(n_tensors):
        name, dims = value(8), [take("Q") for _ in range(take("I"))]
        infos.append((name, tuple(reversed(dims)), take("I"), take("Q")))
    align = meta.get("general.alignment", 32)
    start, tensors = (pos + align - 1) // align * align, {}
    for name, shape, qtype, offset in infos:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
        row_bytes = shape[-1] // block * block_bytes
        end = start + offset + row_bytes * int(np.prod(shape[:-1], dtype=np.int64))
        raw = data[start + offset : end].reshape(*shape[:-1], row_bytes)
        tensors[name] = GGUFTensor(name, qtype, shape, raw)
    return meta, tensors


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: str = "float32") -> Path:
    """Converts a GGUF file into an MLX model folder that ``mlx_lm.load`` reads.

    Writes ``config.json``, ``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``
    (with a chat template: the file's own, or Gemma's turn template for ``gemma3``),
    ``special_tokens_map.json`` and ``generation_config.json`` (EOS ids, e.g. ``[1, 106]``).

    Args:
        gguf_path: The ``.gguf`` file.
        out_dir: Folder to write (created if missing; files in it are overwritten).
        dtype: Weight dtype, an ``mlx.core`` name: ``float32``, ``bfloat16`` or ``float16``.

    Returns:
        ``out_dir``.

    Raises:
        ValueError: If the architecture, tokenizer or RoPE variant is not supported (the message
            names it and the file).
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
    tokenizer, tokenizer_config = build_tokenizer(meta, gguf_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {}
    for tensor in tensors.values():
        name, array = _convert_tensor(tensor, config)
        weights[name] = mx.array(array).astype(getattr(mx, dtype))
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    del weights
    tokenizer.save(str(out_dir / "tokenizer.json"))
    special = {k: v for k, v in tokenizer_config.items() if k in _SPECIAL_TOKENS}
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
    eos = [meta["tokenizer.ggml.eos_token_id"]]
    tokens = meta["tokenizer.ggml.tokens"]
    turn_end = tokens.index("<end_of_turn>") if "<end_of_turn>" in tokens else None
    for extra in (meta.get("tokenizer.ggml.eot_token_id"), turn_end):
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
    if arch == "gemma3":  # Gemma 3 facts the GGUF lacks
        # NOTE: as llama.cpp, Gemma 3 27B (62 layers) scales queries by hidden / heads.
        scalar = hidden // heads if get("block_count") == 62 else head_dim
        config.update(
            sliding_window=get("attention.sliding_window", 512),
            sliding_window_pattern=6,
            rope_local_base_freq=10000.0,
            query_pre_attn_scalar=scalar,
        )
        return config
    if "rope_freqs.weight" in tensors:
        raise ValueError(f"Llama 3 RoPE factors (rope_freqs) in {path} are not supported")
    if get("rope.dimension_count", head_dim) != head_dim:
        raise ValueError(f"Partial rotary embeddings in {path} are not supported")
    config["attention_bias"] = "blk.0.attn_q.bias" in tensors
    config["mlp_bias"] = "blk.0.ffn_gate.bias" in tensors
    return config


def _convert_tensor(tensor: GGUFTensor, config: dict) -> tuple[str, np.ndarray]:
    """Maps a llama.cpp tensor to its mlx-lm name and float32 values."""
    gemma = config["model_type"] == "gemma3_text"
    *base, suffix = tensor.name.split(".")
    if len(base) == 1 and base[0] in _TOP_LEVEL:
        name = f"{_TOP_LEVEL[base[0]]}.{suffix}"
    elif len(base) == 3 and base[0] == "blk" and (base[2] in _LAYER or base[2] == "ffn_norm"):
        # NOTE: llama's ffn_norm sits before the MLP, the slot mlx-lm calls post_attention.
        layer = _LAYER.get(base[2]) or (
            "pre_feedforward_layernorm" if gemma else "post_attention_layernorm"
        )
        name = f"model.layers.{base[1]}.{layer}.{suffix}"
    else:
        raise ValueError(f"Unknown GGUF tensor {tensor.name!r} for {config['model_type']}")
    array = tensor.dequantize()
    if gemma and base[-1].endswith("norm"):
        array = array - 1.0
    elif not gemma and base[-1] in ("attn_q", "attn_k"):
        heads = config["num_attention_heads" if base[-1] == "attn_q" else "num_key_value_heads"]
        array = unpermute_qk(array, heads)
    return name, array


def unpermute_qk(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Undoes llama.cpp's Q/K row permutation (interleaved RoPE pairs → halves).

    Args:
        weight: ``(n_heads * head_dim, in_features)`` weight or ``(n_heads * head_dim,)`` bias.
        n_heads: Heads of this projection (KV heads for K).

    Returns:
        The rows in Hugging Face / mlx-lm order; same shape and dtype.
    """
    split = weight.reshape(n_heads, weight.shape[0] // n_heads // 2, 2, *weight.shape[1:])
    return split.swapaxes(1, 2).reshape(weight.shape)
