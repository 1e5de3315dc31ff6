"""mlxpa: offline batch LLM inference on MLX with a paged KV cache and continuous batching."""

from mlxpa.config import EngineConfig, SamplingParams
from mlxpa.request import RequestOutput

__all__ = ["EngineConfig", "RequestOutput", "SamplingParams"]
