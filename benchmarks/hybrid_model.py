"""A random-weights Qwen 3.5 model folder for the recurrent-hybrid benchmarks (no hub here).

Qwen 3.5's text architecture (mlx-lm's ``qwen3_5``: gated-delta linear attention, every
fourth layer full attention) at about 340M parameters, weights drawn at random and scaled so
greedy tokens vary, with a byte-level BPE tokenizer of 32,000 ids whose tokens are single
CJK characters (see :func:`tokenizer`), so drawn ids round-trip through their text. Random
weights time honestly: the same FLOPs as a trained model of the shape.

    python benchmarks/hybrid_model.py OUT_FOLDER [--layers 16 --hidden 1024]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

VOCAB = 32000


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte's printable stand-in."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = chr(256 + extra), extra + 1
    return chars


def tokenizer(folder: Path) -> None:
    """Write a byte-level BPE tokenizer whose tokens are single CJK characters.

    Transformers loads a ``qwen3_5`` folder's tokenizer as its own byte-level BPE class
    (from ``tokenizer.json``'s vocabulary and merges, not its pre-tokenizer), so the vocabulary
    is made for that class: ``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, the 256 bytes, the
    two-byte heads of U+4E00... and the characters themselves (two merges each), 32,000 ids in
    all. Any run of whole characters encodes to one id per character and decodes back.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    bc = _byte_chars()
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2}
    for b in range(256):
        vocab[bc[b]] = len(vocab)
    merges, cp = [], 0x4E00
    while len(vocab) < VOCAB:
        b1, b2, b3 = (bc[b] for b in chr(cp).encode())
        if b1 + b2 not in vocab:
            vocab[b1 + b2] = len(vocab)
            merges.append((b1, b2))
        if len(vocab) < VOCAB:
            vocab[b1 + b2 + b3] = len(vocab)
            merges.append((b1 + b2, b3))
        cp += 1
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<pad>", "<eos>", "<bos>")])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<pad>")
    fast.save_pretrained(str(folder))


def build(folder: Path, layers: int, hidden: int, seed: int = 0) -> int:
    """Write the model folder; returns its parameter count."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.models import qwen3_5

    config = {"model_type": "qwen3_5", "text_config": {
        "model_type": "qwen3_5", "hidden_size": hidden, "intermediate_size": 3 * hidden,
        "num_hidden_layers": layers, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 256, "linear_num_value_heads": 16, "linear_num_key_heads": 16,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4, "full_attention_interval": 4, "vocab_size": VOCAB,
        "max_position_embeddings": 32768, "tie_word_embeddings": True, "rms_norm_eps": 1e-6},
        "tie_word_embeddings": True, "eos_token_id": 1, "bos_token_id": 2}
    mx.random.seed(seed)
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(config))
    params = []
    for k, v in tree_flatten(model.parameters()):
        if k.endswith("embed_tokens.weight"):
            v = mx.random.normal(v.shape) * 0.02
        elif v.ndim == 2:
            v = mx.random.normal(v.shape) / v.shape[1] ** 0.5
        params.append((k, v))
    model.update(tree_unflatten(params))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    tokenizer(folder)
    return sum(v.size for v in weights.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=1024)
    args = ap.parse_args()
    n = build(Path(args.folder), args.layers, args.hidden)
    print(f"wrote {args.folder}: qwen3_5, {args.layers} layers, hidden {args.hidden}, "
          f"{n / 1e6:.0f}M parameters")


if __name__ == "__main__":
    main()
