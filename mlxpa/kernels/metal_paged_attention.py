"""Paged-attention decode kernels for Apple GPUs (``mx.fast.metal_kernel``).

Algorithm: PagedAttention (Kwon et al., "Efficient Memory Management for Large Language
Model Serving with PagedAttention", SOSP 2023; vLLM's ``paged_attention_v1/v2``): K/V are read
straight from the pool, each key's block looked up in the block table as it is read.

- ``v1`` (single pass): one threadgroup per (query head, sequence), 32 simdgroups. Simdgroup
  ``s`` takes keys ``lo + s, lo + s + 32, ...``; its 32 lanes split the head dimension (lane
  ``l`` owns elements ``l, l + 32, ...``), ``simd_sum`` gives each score, and a float32
  online softmax (running max from a finite minimum, running sum, rescaled accumulator) folds
  the value in. The 32 partial states are merged in threadgroup memory.
- ``v2`` (long contexts): the visible keys are cut into partitions of ``PARTITION_SIZE``
  tokens; one threadgroup per (KV head, sequence, partition) serves all query heads of the KV
  head, so each K/V element is read once for the whole GQA group. It writes float32 partial
  outputs (unnormalised, relative to the partition max) with that max and the exp-sum; an
  empty partition writes the neutral partial (max = -3e38, sum = 0, output = 0). ``reduce``
  then rescales and sums the partials, one threadgroup per (query head, sequence).

- ``qv1`` / ``qv2``: the same over quantized pools (packed words, scales, biases), each
  element dequantized as it is read (``paged_attention_source``).
- ``v1_lse`` / ``qv1_lse`` / ``reduce_lse``: cascade attention's own-keys part (keys from
  ``key_start``): the same, writing the output in float32 and its log-sum-exp.

Template parameters: ``T`` (float32, float16, bfloat16), ``D`` head dim (64, 128, 256),
``BS`` block size (8, 16, 32), ``WINDOW`` (0 or the sliding window), ``HQ``/``HKV`` heads,
``NSG`` simdgroups per threadgroup, ``PART`` partition size; quantized: ``KBITS``, ``VBITS``,
``GS``. The bodies: ``paged_attention_source``; inputs, grids: ``_common``. No Metal-only
syntax beyond ``threadgroup`` arrays: the CUDA twin compiles the same bodies.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from mlxpa.kernels import _common
from mlxpa.kernels.paged_attention_source import SOURCES
from mlxpa.kernels.paged_kv import PagedKV


def is_available() -> bool:
    """Whether this MLX build can run Metal kernels."""
    return mx.metal.is_available()


def build_kernel(kind: str, source: str | None = None):
    """Construct the ``metal_kernel`` for ``kind`` (a key of ``SOURCES``: ``v1``, ``v2``,
    ``reduce``, ``qv1``, ``qv2`` and the ``_lse`` twins); ``source`` overrides the body
    (tests plant bugs this way). Construction compiles nothing."""
    source = SOURCES[kind] if source is None else source
    return mx.fast.metal_kernel(
        name=_common.kernel_name(kind, source), input_names=list(_common.KERNEL_INPUTS[kind]),
        output_names=list(_common.KERNEL_OUTPUTS[kind]), source=source)


@functools.cache
def kernel(kind: str):
    """The cached ``metal_kernel`` for ``kind``, built on first use, never at import."""
    return build_kernel(kind)


def paged_attention(q: mx.array, kv: PagedKV, variant: str | None = None,
                    lse: bool = False) -> mx.array | tuple[mx.array, mx.array]:
    """Decode attention over a paged K/V pool on an Apple GPU (PagedAttention, Kwon et al.
    2023; vLLM). Call only where ``_common.supported`` holds. Arguments as
    ``reference.paged_attention`` with ``L == 1``: ``q`` ``[B, q_heads, 1, head_dim]``, pools
    in float32/float16/bfloat16 (or quantized), no sinks. ``variant``: ``v1``, ``v2``, or
    None to pick (``_common.choose_variant``).

    Returns:
        ``[B, q_heads, 1, head_dim]`` in ``q.dtype``; rows with no visible key are zeros.
        With ``lse`` (cascade attention's own-keys part): that output in float32 and the
        ``[B, q_heads, 1]`` float32 log-sum-exps (``cascade_reference.paged_attention_lse``; about
        ``-3e38`` for a row with no visible key).
    """
    return _common.run_decode(kernel, q, kv, variant, lse)
