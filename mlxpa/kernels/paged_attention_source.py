"""The paged-attention decode kernel bodies, shared by the Metal and CUDA back ends.

The bodies are Metal Shading Language for ``mx.fast.metal_kernel`` (algorithm:
``metal_paged_attention``'s docstring) with nothing Metal-only beyond ``threadgroup`` arrays,
so ``cuda_paged_attention`` compiles the same text through a header of Metal names.

Each decode body has a quantized-pool twin (``qv1``, ``qv2``; :func:`quantized`), for pools
stored as mlx-lm's affine group quantization (:mod:`mlxpa.kernels.quant`): the K/V inputs
become packed ``uint32`` words plus scales and biases, and every K/V element a lane reads is
dequantized in float32 as it is read (``scale * q + bias``), the rest of the body unchanged.
Lane ``l`` owns head-dim elements ``l, l + 32, ...``: element ``l + 32 i`` sits in word
``i * BITS + l * BITS / 32`` at bit ``l * BITS % 32`` (the same shift for every ``i``) and in
group ``i * 32 / GS`` (``GS`` a multiple of 32), so a lane precomputes its shift once and reads
one word per element. Extra template parameters: ``KBITS``, ``VBITS`` (4 or 8) and ``GS``
(32, 64 or 128).

``v1_lse``, ``qv1_lse`` and ``reduce_lse`` (:func:`with_lse`) are the twins cascade attention
runs for each row's own keys (from ``key_start``, after its group's shared prefix): the same
bodies writing the output in float32 and its log-sum-exp, which the merge with the shared
part needs (``v2``/``qv2`` already write the partition maxima and sums ``reduce_lse`` reads).
"""

from __future__ import annotations

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


# Quantized pools: the lane's bit shift in a word and the element mask, once per thread.
_QUANT_LANE = """
    constexpr uint32_t KMASK = (1u << KBITS) - 1u;
    constexpr uint32_t VMASK = (1u << VBITS) - 1u;
    const uint32_t kshift = uint32_t(lane * KBITS % 32);
    const uint32_t vshift = uint32_t(lane * VBITS % 32);
"""

# Quantized pools: the key's row (block, KV head, offset), the lane's first packed word and
# the row's scales and biases.
_QUANT_KEY_BASE = """
      const int t = pos - ks;
      const int64_t row = (int64_t(bt[t / BS]) * HKV + hkv) * BS + t % BS;
      auto kw = k_packed + row * (D * KBITS / 32) + lane * KBITS / 32;
      auto vw = v_packed + row * (D * VBITS / 32) + lane * VBITS / 32;
      auto ksc = k_scales + row * (D / GS);
      auto kbi = k_biases + row * (D / GS);
      auto vsc = v_scales + row * (D / GS);
      auto vbi = v_biases + row * (D / GS);
"""

# The lane's element i of the key / value, dequantized.
_QUANT_LOADS = {
    "float(key_cache[base + 32 * i])":
        "(float((kw[i * KBITS] >> kshift) & KMASK) * float(ksc[i * 32 / GS])"
        " + float(kbi[i * 32 / GS]))",
    "float(value_cache[base + 32 * i])":
        "(float((vw[i * VBITS] >> vshift) & VMASK) * float(vsc[i * 32 / GS])"
        " + float(vbi[i * 32 / GS]))",
}


def quantized(source: str) -> str:
    """The quantized-pool twin of a decode body (``v1`` or ``v2``): the same text with each
    K/V read dequantized (see the module docstring).

    Raises:
        ValueError: ``source`` lacks one of the pieces replaced (an edited body).
    """
    pieces = {_RANGE: _RANGE + _QUANT_LANE, _KEY_BASE: _QUANT_KEY_BASE, **_QUANT_LOADS}
    for old, new in pieces.items():
        if old not in source:
            raise ValueError(f"decode body lacks {old.strip()[:40]!r}")
        source = source.replace(old, new)
    if "key_cache" in source or "value_cache" in source:
        raise ValueError("a K/V read of the decode body is not dequantized")
    return source


# Cascade attention's own-keys part: the output in float32 (not rounded to T before the
# merge) and the natural log-sum-exp of each (row, query head): gm + log(gl), NEG (-3e38,
# which merges as -inf) for a row with no visible key. (old, new) per body.
_LSE_EDITS = {
    "v1": ("op[c * CH + tid] = static_cast<T>(o * inv);", "op[c * CH + tid] = o * inv;",
           "tid == 0"),
    "reduce": ("= static_cast<T>(gl > 0.0f ? o / gl : 0.0f);", "= gl > 0.0f ? o / gl : 0.0f;",
               "d == 0"),
}
_LSE_WRITE = """
    if ({first}) {{
      lse[int64_t(b) * HQ + hq] = gl > 0.0f ? gm + metal::log(gl) : NEG;
    }}
"""


def with_lse(source: str, kind: str) -> str:
    """The twin of a ``v1`` (or ``qv1``) or ``reduce`` body that writes a float32 output and
    a second output ``lse`` ``[B, HQ]`` (the own-keys part of cascade attention, whose keys
    start at ``key_start``; ``_common`` launches it with those outputs).

    Raises:
        ValueError: ``source`` lacks the output write of ``kind`` (an edited body).
    """
    old, new, first = _LSE_EDITS[kind]
    if source.count(old) != 1:
        raise ValueError(f"{kind} body lacks {old!r}")
    return source.replace(old, new) + _LSE_WRITE.format(first=first)


SOURCES = {"v1": _DECODE_V1_SOURCE, "v2": _DECODE_V2_SOURCE, "reduce": _REDUCE_SOURCE,
           "qv1": quantized(_DECODE_V1_SOURCE), "qv2": quantized(_DECODE_V2_SOURCE)}
SOURCES |= {"v1_lse": with_lse(SOURCES["v1"], "v1"), "qv1_lse": with_lse(SOURCES["qv1"], "v1"),
            "reduce_lse": with_lse(SOURCES["reduce"], "reduce")}
