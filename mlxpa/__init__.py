"""mlxpa: offline batch LLM inference on MLX with a paged KV cache and continuous batching.

Importing mlxpa before mlx loads an installed OpenBLAS/MKL for MLX's Linux CPU back end
(:func:`mlxpa._blas.preload`); mlx itself is imported only when a model is loaded.
"""

from mlxpa._blas import preload as _preload_blas

_preload_blas()

from mlxpa.config import EngineConfig, SamplingParams  # noqa: E402

__all__ = ["EngineConfig", "SamplingParams"]
