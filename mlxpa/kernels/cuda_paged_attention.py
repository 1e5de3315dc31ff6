"""Paged-attention decode kernels for NVIDIA GPUs (``mx.fast.cuda_kernel``): the Metal twin.

Algorithm: PagedAttention (Kwon et al., SOSP 2023; vLLM), decode v1/v2 + reduce (and the
quantized-pool ``qv1``/``qv2``) exactly as in ``metal_paged_attention`` (see its docstring):
the same kernel bodies (``paged_attention_source``; cascade attention's ``_lse`` twins
included) compile as CUDA through ``CUDA_HEADER``, which maps the Metal names they use
(threadgroup memory and barriers, simdgroup = warp, ``simd_sum`` as a butterfly of
``__shfl_xor_sync``, ``metal::max/min/exp/log``). Kernels are built lazily in
``functools.cache`` factories: on MLX builds without CUDA, ``mx.fast.cuda_kernel`` raises at
construction.

``generated_source`` reproduces the source MLX's CUDA back end (``custom_kernel.cpp``,
``build_kernel``) generates for a launch, with a self-contained prelude in place of MLX's
``utils.cuh``, so ``nvcc`` can check it where MLX-CUDA is absent (register use, spills) and
CuPy can run the same text (``scripts/gpu_check.py``).
"""

from __future__ import annotations

import functools

import mlx.core as mx

from mlxpa.kernels import _common
from mlxpa.kernels.paged_attention_source import SOURCES
from mlxpa.kernels.paged_kv import PagedKV

CUDA_HEADER = """
// mlxpa: the Metal names of the paged-attention bodies, in CUDA (one simdgroup = one warp).
#ifndef MLXPA_METAL_COMPAT
#define MLXPA_METAL_COMPAT
#define threadgroup __shared__
#define threadgroup_position_in_grid blockIdx
#define thread_position_in_threadgroup threadIdx
#define simdgroup_index_in_threadgroup (threadIdx.x / 32)
#define thread_index_in_simdgroup (threadIdx.x % 32)
#define threadgroup_barrier(flags) __syncthreads()
namespace metal {
__device__ __forceinline__ int max(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ int min(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ float max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ float min(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ float exp(float x) { return expf(x); }
__device__ __forceinline__ float log(float x) { return logf(x); }
__device__ __forceinline__ float simd_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    x += __shfl_xor_sync(0xffffffffu, x, o);
  }
  return x;
}
}  // namespace metal
using metal::simd_sum;
#endif
"""

# Stands in for MLX's "mlx/backend/cuda/device/utils.cuh" (its default header) outside MLX.
_STANDALONE_PRELUDE = """#include <cuda_bf16.h>
#include <cuda_fp16.h>
#ifdef __CUDACC_RTC__
#include <cuda/std/cstdint>
using cuda::std::int32_t;
using cuda::std::int64_t;
using cuda::std::uint32_t;
#else
#include <cstdint>
#endif

#include <cooperative_groups.h>

"""

_CUDA_TYPES = {mx.float32: "float", mx.float16: "__half", mx.bfloat16: "__nv_bfloat16",
               mx.int32: "int32_t", mx.uint32: "uint32_t"}


def is_available() -> bool:
    """Whether this MLX build can run CUDA kernels."""
    return mx.cuda.is_available()


def kernel_name(kind: str) -> str:
    return _common.kernel_name(kind, SOURCES[kind], CUDA_HEADER)


@functools.cache
def kernel(kind: str):
    """The cached ``cuda_kernel`` for ``kind`` (a key of ``SOURCES``: ``v1``, ``v2``,
    ``reduce``, ``qv1``, ``qv2`` and the ``_lse`` twins), built on first use. Raises
    ``RuntimeError`` on MLX builds without CUDA."""
    return mx.fast.cuda_kernel(
        name=kernel_name(kind), input_names=list(_common.KERNEL_INPUTS[kind]),
        output_names=list(_common.KERNEL_OUTPUTS[kind]), source=SOURCES[kind],
        header=CUDA_HEADER)


def input_dtypes(kind: str, dtype: mx.Dtype) -> tuple[mx.Dtype, ...]:
    """Input dtypes of ``kind`` when ``q`` and the pools (quantized: their scales) are
    ``dtype``."""
    if kind.startswith("reduce"):
        return (mx.float32, mx.float32, mx.float32, mx.int32)
    pools = (mx.uint32, dtype, dtype) * 2 if kind.startswith("q") else (dtype, dtype)
    return (dtype, *pools) + (mx.int32,) * 5 + (mx.float32,)


def generated_source(launch: _common.Launch, source: str | None = None) -> str:
    """The CUDA text MLX generates for ``launch`` (MLX 0.32 ``build_kernel``), prelude
    replaced by a standalone one; the kernel is ``mlx::core::cu::<kernel_name(kind)>``."""
    kind = launch.kind
    names, outs = _common.KERNEL_INPUTS[kind], _common.KERNEL_OUTPUTS[kind]
    params = [f"    const {_CUDA_TYPES[d]}* {n}"
              for n, d in zip(names, input_dtypes(kind, dict(launch.template)["T"]))]
    params += [f"    {_CUDA_TYPES[d]}* {n}" for n, d in zip(outs, launch.output_dtypes)]
    consts = []
    for name, arg in launch.template:
        if isinstance(arg, bool):
            consts.append(f"  constexpr bool {name} = {str(arg).lower()};\n")
        elif isinstance(arg, int):
            consts.append(f"  constexpr int {name} = {arg};\n")
        else:
            consts.append(f"  using {name} = {_CUDA_TYPES[arg]};\n")
    return (_STANDALONE_PRELUDE + CUDA_HEADER + "namespace mlx::core::cu {\n\n"
            "namespace cg = cooperative_groups;\n\n"
            f"__global__ void {kernel_name(kind)}(\n" + ",\n".join(params) + ") {\n"
            + "".join(consts) + "\n" + (SOURCES[kind] if source is None else source)
            + "\n}\n\n} // namespace mlx::core::cu\n")


def paged_attention(q: mx.array, kv: PagedKV, variant: str | None = None) -> mx.array:
    """Decode attention over a paged K/V pool on an NVIDIA GPU (PagedAttention, Kwon et al.
    2023; vLLM). Arguments, shapes and dtypes as ``metal_paged_attention.paged_attention``.

    Returns:
        ``[B, q_heads, 1, head_dim]`` in ``q.dtype``; rows with no visible key are zeros.
    """
    return _common.run_decode(kernel, q, kv, variant, choose=_common.choose_variant_cuda)
