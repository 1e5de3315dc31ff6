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

Template parameters: ``T`` (float32, float16, bfloat16), ``D`` head dim (64, 128, 256),
``BS`` block size (8, 16, 32), ``WINDOW`` (0 or the sliding window), ``HQ``/``HKV`` heads,
``NSG`` simdgroups per threadgroup, ``PART`` partition size. Inputs, grids: ``_common``. No
Metal-only syntax beyond ``threadgroup`` arrays: the CUDA twin compiles the same bodies.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from mlxpa.kernels import _common

# Visible key range [lo, hi) of row b, shared by v1 and v2: inside the table, causal, inside
# the context and inside the window (reference.attention_mask).
_RANGE = """
    const int mb = meta[0];
    const int ks = key_start[b];
    const int qpos = query_start[b];
    const int lo = WINDOW > 0 ? metal::max(ks, qpos - WINDOW + 1) : ks;
    const int hi = metal::min(metal::min(context_lens[b], qpos + 1), ks + mb * BS);
    const float sc = scale[0];
    auto bt = block_tables + int64_t(b) * mb;
"""

# Pool offset of key `pos` for this lane: the block table is read per token.
_KEY_BASE = """
      const int t = pos - ks;
      const int64_t base = ((int64_t(bt[t / BS]) * HKV + hkv) * BS + t % BS) * D + lane;
"""

_DECODE_V1_SOURCE = """
    constexpr int DPL = D / 32;            // head-dim elements per lane
    constexpr int CH = D < 128 ? D : 128;  // merge chunk (threadgroup memory: NSG * CH floats)
    constexpr float NEG = -3.0e38f;        // finite minimum: no inf - inf
    const int hq = int(threadgroup_position_in_grid.x);
    const int b = int(threadgroup_position_in_grid.y);
    const int sg = int(simdgroup_index_in_threadgroup);
    const int lane = int(thread_index_in_simdgroup);
    const int tid = sg * 32 + lane;
    const int hkv = hq / (HQ / HKV);
""" + _RANGE + """
    float qv[DPL], acc[DPL];
    auto qp = q + (int64_t(b) * HQ + hq) * D + lane;
    #pragma unroll
    for (int i = 0; i < DPL; i++) {
      qv[i] = float(qp[32 * i]) * sc;
      acc[i] = 0.0f;
    }
    float m = NEG, l = 0.0f;
    for (int pos = lo + sg; pos < hi; pos += NSG) {""" + _KEY_BASE + """
      float dot = 0.0f;
      #pragma unroll
      for (int i = 0; i < DPL; i++) {
        dot += qv[i] * float(key_cache[base + 32 * i]);
      }
      const float s = simd_sum(dot);
      const float m_new = metal::max(m, s);
      const float alpha = metal::exp(m - m_new);
      const float p = metal::exp(s - m_new);
      l = l * alpha + p;
      #pragma unroll
      for (int i = 0; i < DPL; i++) {
        acc[i] = acc[i] * alpha + p * float(value_cache[base + 32 * i]);
      }
      m = m_new;
    }

    threadgroup float sg_m[NSG], sg_l[NSG];
    threadgroup float sg_acc[NSG * CH];
    if (lane == 0) {
      sg_m[sg] = m;
      sg_l[sg] = l;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float gm = NEG;
    for (int s = 0; s < NSG; s++) {
      gm = metal::max(gm, sg_m[s]);
    }
    float gl = 0.0f;
    for (int s = 0; s < NSG; s++) {
      gl += sg_l[s] * metal::exp(sg_m[s] - gm);
    }
    const float f = metal::exp(m - gm);
    const float inv = gl > 0.0f ? 1.0f / gl : 0.0f;
    auto op = out + (int64_t(b) * HQ + hq) * D;
    #pragma unroll
    for (int c = 0; c < D / CH; c++) {
      #pragma unroll
      for (int i = c * CH / 32; i < (c + 1) * CH / 32; i++) {
        sg_acc[sg * CH + lane + 32 * i - c * CH] = acc[i] * f;
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      if (tid < CH) {
        float o = 0.0f;
        for (int s = 0; s < NSG; s++) {
          o += sg_acc[s * CH + tid];
        }
        op[c * CH + tid] = static_cast<T>(o * inv);
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }
"""

_DECODE_V2_SOURCE = """
    constexpr int G = HQ / HKV;            // query heads per KV head
    constexpr int DPL = D / 32;
    constexpr float NEG = -3.0e38f;
    const int hkv = int(threadgroup_position_in_grid.x);
    const int b = int(threadgroup_position_in_grid.y);
    const int part = int(threadgroup_position_in_grid.z);
    const int sg = int(simdgroup_index_in_threadgroup);
    const int lane = int(thread_index_in_simdgroup);
    const int tid = sg * 32 + lane;
    const int np = meta[1];
""" + _RANGE + """
    const int p_lo = lo + part * PART;
    const int p_hi = metal::min(hi, p_lo + PART);
    const int64_t row0 = (int64_t(b) * HQ + hkv * G) * np + part;  // head g: row0 + g * np
    if (p_lo >= p_hi) {
      for (int g = 0; g < G; g++) {
        const int64_t r = row0 + g * np;
        if (tid == 0) {
          max_logits[r] = NEG;
          exp_sums[r] = 0.0f;
        }
        for (int d = tid; d < D; d += NSG * 32) {
          partial_out[r * D + d] = 0.0f;
        }
      }
      return;
    }
    float qv[G][DPL], acc[G][DPL], m[G], l[G];
    #pragma unroll
    for (int g = 0; g < G; g++) {
      auto qp = q + (int64_t(b) * HQ + hkv * G + g) * D + lane;
      #pragma unroll
      for (int i = 0; i < DPL; i++) {
        qv[g][i] = float(qp[32 * i]) * sc;
        acc[g][i] = 0.0f;
      }
      m[g] = NEG;
      l[g] = 0.0f;
    }
    for (int pos = p_lo + sg; pos < p_hi; pos += NSG) {""" + _KEY_BASE + """
      float kv[DPL];
      #pragma unroll
      for (int i = 0; i < DPL; i++) {
        kv[i] = float(key_cache[base + 32 * i]);
      }
      float s[G];
      #pragma unroll
      for (int g = 0; g < G; g++) {
        float dot = 0.0f;
        #pragma unroll
        for (int i = 0; i < DPL; i++) {
          dot += qv[g][i] * kv[i];
        }
        s[g] = simd_sum(dot);
      }
      #pragma unroll
      for (int i = 0; i < DPL; i++) {
        kv[i] = float(value_cache[base + 32 * i]);
      }
      #pragma unroll
      for (int g = 0; g < G; g++) {
        const float m_new = metal::max(m[g], s[g]);
        const float alpha = metal::exp(m[g] - m_new);
        const float p = metal::exp(s[g] - m_new);
        l[g] = l[g] * alpha + p;
        #pragma unroll
        for (int i = 0; i < DPL; i++) {
          acc[g][i] = acc[g][i] * alpha + p * kv[i];
        }
        m[g] = m_new;
      }
    }

    threadgroup float sg_m[G * NSG], sg_l[G * NSG];
    threadgroup float sg_acc[NSG * D];
    if (lane == 0) {
      #pragma unroll
      for (int g = 0; g < G; g++) {
        sg_m[g * NSG + sg] = m[g];
        sg_l[g * NSG + sg] = l[g];
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    #pragma unroll
    for (int g = 0; g < G; g++) {
      float gm = NEG;
      for (int s = 0; s < NSG; s++) {
        gm = metal::max(gm, sg_m[g * NSG + s]);
      }
      float gl = 0.0f;
      for (int s = 0; s < NSG; s++) {
        gl += sg_l[g * NSG + s] * metal::exp(sg_m[g * NSG + s] - gm);
      }
      const float f = metal::exp(m[g] - gm);
      #pragma unroll
      for (int i = 0; i < DPL; i++) {
        sg_acc[sg * D + lane + 32 * i] = acc[g][i] * f;
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      const int64_t r = row0 + g * np;
      for (int d = tid; d < D; d += NSG * 32) {
        float o = 0.0f;
        for (int s = 0; s < NSG; s++) {
          o += sg_acc[s * D + d];
        }
        partial_out[r * D + d] = o;
      }
      if (tid == 0) {
        max_logits[r] = gm;
        exp_sums[r] = gl;
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }
"""

_REDUCE_SOURCE = """
    constexpr float NEG = -3.0e38f;
    const int hq = int(threadgroup_position_in_grid.x);
    const int b = int(threadgroup_position_in_grid.y);
    const int d = int(thread_position_in_threadgroup.x);
    const int np = meta[1];
    const int64_t row = (int64_t(b) * HQ + hq) * np;
    float gm = NEG;
    for (int p = 0; p < np; p++) {
      gm = metal::max(gm, max_logits[row + p]);
    }
    float gl = 0.0f, o = 0.0f;
    for (int p = 0; p < np; p++) {
      const float w = metal::exp(max_logits[row + p] - gm);
      gl += exp_sums[row + p] * w;
      o += partial_out[(row + p) * D + d] * w;
    }
    out[(int64_t(b) * HQ + hq) * D + d] = static_cast<T>(gl > 0.0f ? o / gl : 0.0f);
"""

SOURCES = {"v1": _DECODE_V1_SOURCE, "v2": _DECODE_V2_SOURCE, "reduce": _REDUCE_SOURCE}


def is_available() -> bool:
    """Whether this MLX build can run Metal kernels."""
    return mx.metal.is_available()


def build_kernel(kind: str, source: str | None = None):
    """Construct the ``metal_kernel`` for ``kind`` (``v1``, ``v2``, ``reduce``); ``source``
    overrides the body (tests plant bugs this way). Construction compiles nothing."""
    source = SOURCES[kind] if source is None else source
    return mx.fast.metal_kernel(
        name=_common.kernel_name(kind, source), input_names=list(_common.KERNEL_INPUTS[kind]),
        output_names=list(_common.KERNEL_OUTPUTS[kind]), source=source)


@functools.cache
def kernel(kind: str):
    """The cached ``metal_kernel`` for ``kind``, built on first use, never at import."""
    return build_kernel(kind)


def paged_attention(q: mx.array, key_cache: mx.array, value_cache: mx.array,
                    block_tables: mx.array, context_lens: mx.array, query_start: mx.array, *,
                    scale: float, sliding_window: int | None = None,
                    key_start: mx.array | None = None, variant: str | None = None) -> mx.array:
    """Decode attention over a paged K/V pool on an Apple GPU (PagedAttention, Kwon et al.
    2023; vLLM). Call only where ``_common.supported`` holds. Arguments as
    ``reference.paged_attention`` with ``L == 1``: ``q`` ``[B, q_heads, 1, head_dim]`` and
    pools ``[num_blocks, kv_heads, block_size, head_dim]`` in float32/float16/bfloat16,
    ``block_tables`` ``[B, max_blocks]``, ``context_lens``/``query_start``/``key_start``
    ``[B]`` int32. ``variant``: ``v1``, ``v2``, or None to pick (``_common.choose_variant``).

    Returns:
        ``[B, q_heads, 1, head_dim]`` in ``q.dtype``; rows with no visible key are zeros.
    """
    return _common.run_decode(kernel, q, key_cache, value_cache, block_tables, context_lens,
                              query_start, scale=scale, sliding_window=sliding_window,
                              key_start=key_start, variant=variant)
