"""The engine: requests in, outputs out (:class:`LLMEngine`), detokenization and metrics;
:class:`~mlxpa.engine.stream.RequestStream` runs windows of requests through it in prefix
order."""

from mlxpa.engine.llm_engine import LLMEngine

__all__ = ["LLMEngine"]
