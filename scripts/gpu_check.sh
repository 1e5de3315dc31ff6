#!/usr/bin/env bash
# Run the CUDA twin of mlxpa's paged-attention kernels on an NVIDIA GPU: correctness against a
# float64 reference on random cases (cascade attention's _lse twins included: output and
# log-sum-exp of keys from a block offset), then decode timings (contexts 512..32k, batch 1..256)
# against gather + SDPA, with bandwidth as a fraction of a device-to-device copy.
#
# Needs nvcc and CuPy (PyTorch for the gather + SDPA baseline); MLX is optional: with an MLX
# CUDA build it also runs the CUDA kernel tests through mx.fast.cuda_kernel.
# Usage: scripts/gpu_check.sh [--quick] [--json PATH] [--arch sm_90a]
# First run on an NVIDIA H200 on 2026-12-04 (docs/kernels.md has the figures).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
echo "== GPU"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
nvcc --version | tail -n 1
status=0
if "$PY" -c "import mlx.core as mx, sys; sys.exit(0 if mx.cuda.is_available() else 1)" \
    2>/dev/null; then
  echo "== MLX with CUDA: kernel tests"
  "$PY" -m pytest -q tests/kernels/test_cuda.py tests/kernels/test_dispatch.py \
    tests/kernels/test_cascade.py || status=1
fi
echo "== CuPy: scripts/gpu_check.py $*"
"$PY" scripts/gpu_check.py "$@" || status=1
exit $status
