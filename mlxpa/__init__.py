"""mlxpa: offline batch LLM inference on MLX with a paged KV cache and continuous batching.

The Python API is vLLM's offline one::

    from mlxpa import LLM, SamplingParams, StructuredOutputsParams

    llm = LLM()  # the default model; or an MLX folder, a Hugging Face repo id, a .gguf
    outs = llm.generate(["Country: France\\nCapital:"], SamplingParams(max_tokens=4))

Importing mlxpa before mlx loads an installed OpenBLAS/MKL for MLX's Linux CPU back end
(:func:`mlxpa._blas.preload`); mlx itself is imported only when a model is loaded (``LLM`` is
imported on first use for that reason).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlxpa._blas import preload as _preload_blas

_preload_blas()

from mlxpa.config import EngineConfig  # noqa: E402
from mlxpa.entrypoints.outputs import (  # noqa: E402
    AnnotationOutput,
    CompletionOutput,
    Logprob,
    QuestionAnswer,
    RequestOutput,
)
from mlxpa.sampling_params import SamplingParams, StructuredOutputsParams  # noqa: E402

if TYPE_CHECKING:
    from mlxpa.entrypoints.llm import LLM

__all__ = ["LLM", "AnnotationOutput", "CompletionOutput", "EngineConfig", "Logprob",
           "QuestionAnswer", "RequestOutput", "SamplingParams", "StructuredOutputsParams"]


def __getattr__(name: str) -> object:
    if name == "LLM":  # imports mlx: only when asked for
        from mlxpa.entrypoints.llm import LLM

        return LLM
    raise AttributeError(f"module 'mlxpa' has no attribute {name!r}")
