"""The engine: requests in, outputs out (:class:`LLMEngine`), detokenization and metrics;
:class:`~mlxpa.engine.stream.RequestStream` runs windows of requests through it in prefix
order; :class:`~mlxpa.engine.async_llm.AsyncLLM` runs it in its own thread for requests that
arrive over time (a server)."""

from mlxpa.engine.llm_engine import LLMEngine

__all__ = ["LLMEngine"]
