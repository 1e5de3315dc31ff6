// ==== v1_lse ====
template <typename T, int D, int BS, int WINDOW, int HQ, int HKV, int NSG>
[[kernel]] void custom_kernel_mlxpa_paged_v1_lse_609fafc786__bfloat16_t_256_16_0_4_1_32_bfloat16_t_bfloat16_t_bfloat16_t_int32_t_int32_t_int32_t_int32_t_int32_tc_floatc_float_float(
  const device bfloat16_t* q [[buffer(0)]],
  const device bfloat16_t* key_cache [[buffer(1)]],
  const device bfloat16_t* value_cache [[buffer(2)]],
  const device int32_t* block_tables [[buffer(3)]],
  const device int32_t* context_lens [[buffer(4)]],
  const device int32_t* query_start [[buffer(5)]],
  const device int32_t* key_start [[buffer(6)]],
  const constant int32_t* meta [[buffer(7)]],
  const constant float* scale [[buffer(8)]],
  device float* out [[buffer(9)]],
  device float* lse [[buffer(10)]],
  uint simdgroup_index_in_threadgroup [[simdgroup_index_in_threadgroup]],
  uint thread_index_in_simdgroup [[thread_index_in_simdgroup]],
  uint3 threadgroup_position_in_grid [[threadgroup_position_in_grid]]) {

    constexpr int DPL = D / 32;            // head-dim elements per lane
    constexpr int CH = D < 128 ? D : 128;  // merge chunk (threadgroup memory: NSG * CH floats)
    constexpr float NEG = -3.0e38f;        // finite minimum: no inf - inf
    const int hq = int(threadgroup_position_in_grid.x);
    const int b = int(threadgroup_position_in_grid.y);
    const int sg = int(simdgroup_index_in_threadgroup);
    const int lane = int(thread_index_in_simdgroup);
    const int tid = sg * 32 + lane;
    const int hkv = hq / (HQ / HKV);

    const int mb = meta[0];
    const int ks = key_start[b];
    const int qpos = query_start[b];
    const int lo = WINDOW > 0 ? metal::max(ks, qpos - WINDOW + 1) : ks;
    const int hi = metal::min(metal::min(context_lens[b], qpos + 1), ks + mb * BS);
    const float sc = scale[0];
    auto bt = block_tables + int64_t(b) * mb;

    float qv[DPL], acc[DPL];
    auto qp = q + (int64_t(b) * HQ + hq) * D + lane;
    #pragma unroll
    for (int i = 0; i < DPL; i++) {
      qv[i] = float(qp[32 * i]) * sc;
      acc[i] = 0.0f;
    }
    float m = NEG, l = 0.0f;
    for (int pos = lo + sg; pos < hi; pos += NSG) {
      const int t = pos - ks;
      const int64_t base = ((int64_t(bt[t / BS]) * HKV + hkv) * BS + t % BS) * D + lane;

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
        op[c * CH + tid] = o * inv;
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }

    if (tid == 0) {
      lse[int64_t(b) * HQ + hq] = gl > 0.0f ? gm + metal::log(gl) : NEG;
    }

}

template [[host_name("custom_kernel_mlxpa_paged_v1_lse_609fafc786__bfloat16_t_256_16_0_4_1_32_bfloat16_t_bfloat16_t_bfloat16_t_int32_t_int32_t_int32_t_int32_t_int32_tc_floatc_float_float")]] [[kernel]] decltype(custom_kernel_mlxpa_paged_v1_lse_609fafc786__bfloat16_t_256_16_0_4_1_32_bfloat16_t_bfloat16_t_bfloat16_t_int32_t_int32_t_int32_t_int32_t_int32_tc_floatc_float_float<bfloat16_t, 256, 16, 0, 4, 1, 32>) custom_kernel_mlxpa_paged_v1_lse_609fafc786__bfloat16_t_256_16_0_4_1_32_bfloat16_t_bfloat16_t_bfloat16_t_int32_t_int32_t_int32_t_int32_t_int32_tc_floatc_float_float<bfloat16_t, 256, 16, 0, 4, 1, 32>;

// ==== reduce_lse ====
template <typename T, int D, int HQ>
[[kernel]] void custom_kernel_mlxpa_paged_reduce_lse_203dbe921e__bfloat16_t_256_4_float_float_float_int32_tc_float_float(
  const device float* partial_out [[buffer(0)]],
  const device float* max_logits [[buffer(1)]],
  const device float* exp_sums [[buffer(2)]],
  const constant int32_t* meta [[buffer(3)]],
  device float* out [[buffer(4)]],
  device float* lse [[buffer(5)]],
  uint3 thread_position_in_threadgroup [[thread_position_in_threadgroup]],
  uint3 threadgroup_position_in_grid [[threadgroup_position_in_grid]]) {

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
    out[(int64_t(b) * HQ + hq) * D + d] = gl > 0.0f ? o / gl : 0.0f;

    if (d == 0) {
      lse[int64_t(b) * HQ + hq] = gl > 0.0f ? gm + metal::log(gl) : NEG;
    }

}

template [[host_name("custom_kernel_mlxpa_paged_reduce_lse_203dbe921e__bfloat16_t_256_4_float_float_float_int32_tc_float_float")]] [[kernel]] decltype(custom_kernel_mlxpa_paged_reduce_lse_203dbe921e__bfloat16_t_256_4_float_float_float_int32_tc_float_float<bfloat16_t, 256, 4>) custom_kernel_mlxpa_paged_reduce_lse_203dbe921e__bfloat16_t_256_4_float_float_float_int32_tc_float_float<bfloat16_t, 256, 4>;

