"""What a loaded model and its runtime are, for the disk KV tier's namespace when no folder
names the model (a model object handed to the engine): its weights' names, shapes, dtypes
and bytes, and the tokenizer's vocabulary."""

from __future__ import annotations

import hashlib
import json

import mlx.core as mx
from mlx.utils import tree_flatten


def weights_fingerprint(model) -> str:
    """A hex digest of every parameter of ``model`` (name, shape, dtype, bytes): O(weights),
    about a second per GB; a model loaded from a folder uses the folder's cheaper
    fingerprint (:func:`mlxpa.loader.identity.folder_fingerprint`)."""
    h = hashlib.sha256()
    for name, value in tree_flatten(model.parameters()):
        data = mx.contiguous(value.reshape(-1)).view(mx.uint8)
        mx.eval(data)
        h.update(f"{name}\0{value.shape}\0{value.dtype}\n".encode())
        h.update(memoryview(data))
    return h.hexdigest()


def tokenizer_fingerprint(tokenizer) -> str:
    """A hex digest of the tokenizer's vocabulary and special tokens."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    vocab = sorted(hf.get_vocab().items()) if hasattr(hf, "get_vocab") else []
    extra = [str(getattr(hf, n, None)) for n in ("bos_token", "eos_token", "chat_template")]
    return hashlib.sha256(json.dumps([vocab, extra]).encode()).hexdigest()


def runtime_identity() -> dict:
    """The MLX version and device: kernels, and so rounding, may change with either."""
    return {"mlx": mx.__version__, "device": str(mx.default_device())}
