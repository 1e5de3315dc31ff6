"""Matrix-product FLOPs of a model's tokens, counted from its weight shapes, and the matmul limit.

A token through the model body costs one multiply-add per weight of every ``Linear`` of the
body (2 FLOPs each); the embedding lookup is a gather (no FLOPs). A token whose logits are
sampled also goes through the LM head, ``vocab x hidden`` multiply-adds (the ``lm_head``
``Linear``, or the tied embedding used as a linear layer). Attention's own products
(``QK^T``, ``PV``) grow with the context and norms, activations and biases are element-wise;
none of them is counted, so the limit is an upper bound on tokens per second (the usual
``2 x parameters`` FLOPs-per-token estimate, Kaplan et al. 2020, split into body and head).
Quantized layers count their logical (dequantized) shape: they do the same multiply-adds.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.nn as nn


@dataclass(frozen=True)
class ModelFlops:
    """FLOPs per token of one model (multiply-add = 2 FLOPs).

    Attributes:
        body: FLOPs of one token through every body ``Linear`` (no LM head).
        head: FLOPs of one token through the LM head.
    """

    body: int
    head: int

    @property
    def prefill(self) -> int:
        """FLOPs per prompt token (no LM head: only the sampled last token needs it)."""
        return self.body

    @property
    def decode(self) -> int:
        """FLOPs per decoded token (body and LM head)."""
        return self.body + self.head

    def work(self, computed_prompt_tokens: int, generated_tokens: int, requests: int) -> int:
        """FLOPs a run needs at least: every computed prompt token and every generated token
        but each request's last through the body (the last is never fed back), every
        generated token through the head."""
        fed_back = max(0, generated_tokens - requests)
        return (computed_prompt_tokens + fed_back) * self.body + generated_tokens * self.head


def logical_shape(layer: nn.Module) -> tuple[int, int]:
    """``(rows, columns)`` of a ``Linear``/``Embedding`` weight as the unquantized layer holds it
    (quantized weights pack ``32 / bits`` values per uint32 column)."""
    rows, cols = layer.weight.shape
    bits = getattr(layer, "bits", None)
    if isinstance(layer, (nn.QuantizedLinear, nn.QuantizedEmbedding)) and bits:
        cols = cols * 32 // bits
    return rows, cols


def model_flops(model: nn.Module) -> ModelFlops:
    """Count :class:`ModelFlops` from the loaded model's ``Linear``/``Embedding`` weights.

    The head is the module named ``lm_head`` when there is one, otherwise the (tied) token
    embedding. Raises ``ValueError`` when the model has neither.
    """
    linear = (nn.Linear, nn.QuantizedLinear)
    embedding = (nn.Embedding, nn.QuantizedEmbedding)
    body, head, embed = 0, None, None
    for name, layer in model.named_modules():
        if isinstance(layer, linear):
            rows, cols = logical_shape(layer)
            if name.split(".")[-1] == "lm_head":
                head = rows * cols
            else:
                body += rows * cols
        elif isinstance(layer, embedding) and embed is None:
            rows, cols = logical_shape(layer)
            embed = rows * cols
    head = head if head is not None else embed
    if head is None:
        raise ValueError(f"{type(model).__name__} has neither an lm_head nor a token embedding")
    return ModelFlops(body=2 * body, head=2 * head)
